// SPDX-License-Identifier: MIT
/*
 * gpu_probes: load an object and attach every program the way its section
 * says, as a skeleton's attach does, then wait. Nothing here knows about
 * CUDA: under bpftime the `cuda:` sections are understood by the handler the
 * syscall shim registers in libbpf, and kprobes become CUDA kernel probes.
 *
 * Usage: gpu_probes [--obj FILE] [--verbose]
 *
 * Prints "attached PROG (SECTION)" per program and "ready" once all are
 * attached, then waits for SIGINT/SIGTERM and prints "count[SLOT]=N" for each
 * slot of the `counts` map, when the object has one. Exits 1 when the object
 * does not load or a program does not attach.
 */
#include "../common/loader.h"
#include "gpu_probes.h"

#define MAX_LINKS 64

static const char usage[] =
	"Usage: gpu_probes [--obj FILE] [--verbose]\n"
	"Attaches every program of FILE (default: gpu_probes.bpf.o beside us)\n"
	"where its section says, until SIGINT/SIGTERM.\n";

static void print_counts(struct bpf_object *obj)
{
	struct bpf_map *map = bpf_object__find_map_by_name(obj, "counts");
	__u32 slot;
	__u64 value;

	if (!map)
		return;
	for (slot = 0; slot < GPU_PROBES_SLOTS; slot++) {
		if (bpf_map__lookup_elem(map, &slot, sizeof(slot), &value,
					 sizeof(value), 0) == 0)
			printf("count[%u]=%llu\n", slot, (unsigned long long)value);
	}
}

int main(int argc, char **argv)
{
	struct loader_args args = {};
	struct bpf_link *links[MAX_LINKS];
	char obj_path[PATH_MAX];
	struct bpf_program *prog;
	struct bpf_object *obj;
	sigset_t signals;
	int n = 0, err, i;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;
	if (!args.obj) {
		if (default_obj_path("gpu_probes.bpf.o", obj_path, sizeof(obj_path)))
			return 1;
		args.obj = obj_path;
	}
	obj = open_and_load(args.obj);
	if (!obj)
		return 1;
	block_exit_signals(&signals);
	bpf_object__for_each_program(prog, obj) {
		struct bpf_link *link;

		if (n == MAX_LINKS) {
			fprintf(stderr, "more than %d programs\n", MAX_LINKS);
			err = 1;
			break;
		}
		link = bpf_program__attach(prog);
		if (!link) {
			fprintf(stderr, "cannot attach program '%s' (%s): %s\n",
				bpf_program__name(prog),
				bpf_program__section_name(prog), strerror(errno));
			err = 1;
			break;
		}
		links[n++] = link;
		printf("attached %s (%s)\n", bpf_program__name(prog),
		       bpf_program__section_name(prog));
	}
	if (!err) {
		announce_ready();
		wait_for_signal(&signals);
		print_counts(obj);
	}
	for (i = 0; i < n; i++)
		bpf_link__destroy(links[i]);
	bpf_object__close(obj);
	return err;
}
