// SPDX-License-Identifier: MIT
/*
 * usdt_count: attach USDT probes with libbpf's bpf_program__attach_usdt() and uprobes at
 * offsets inside a function, then count their hits.
 *
 * Usage: usdt_count --target BINARY [--obj FILE] [--verbose]
 *
 *   --target BINARY  usdt_target (bpf-examples/targets/usdt_target.c)
 *
 * Attaches bpftime_test:tick and bpftime_test:guarded (USDT, semaphores raised by libbpf
 * through the uprobe's ref_ctr_offset) and uprobes at loop_sum+2 and loop_sum+3, prints
 * "ready", waits for SIGINT or SIGTERM, then prints one line per slot:
 *
 *   ticks=<n> tick_sum=<n> guarded=<n> guarded_sum=<n> nop=<n> head=<n> head_sum=<n>
 */
#include <bpf/bpf.h>

#include "../common/loader.h"
#include "usdt_count.h"

static const char usage[] =
	"Usage: usdt_count --target BINARY [--obj FILE] [--verbose]\n"
	"Counts BINARY's bpftime_test USDT probes and the instructions at loop_sum+2 and\n"
	"loop_sum+3 until SIGINT/SIGTERM; then prints the counts.\n";

static const char *const names[SLOT_COUNT] = {
	"ticks", "tick_sum", "guarded", "guarded_sum", "nop", "head", "head_sum",
};

static struct bpf_link *usdt(struct bpf_object *obj, const char *prog_name,
			     const char *target, const char *probe)
{
	struct bpf_program *prog = bpf_object__find_program_by_name(obj, prog_name);
	struct bpf_link *link;

	if (!prog) {
		fprintf(stderr, "program '%s' not found in object\n", prog_name);
		return NULL;
	}
	link = bpf_program__attach_usdt(prog, -1, target, "bpftime_test", probe, NULL);
	if (!link)
		fprintf(stderr, "cannot attach usdt %s:bpftime_test:%s: %s\n", target,
			probe, strerror(errno));
	return link;
}

static struct bpf_link *at_offset(struct bpf_object *obj, const char *prog_name,
				  const char *target, size_t offset)
{
	LIBBPF_OPTS(bpf_uprobe_opts, opts, .func_name = "loop_sum");
	struct bpf_program *prog = bpf_object__find_program_by_name(obj, prog_name);
	struct bpf_link *link;

	if (!prog) {
		fprintf(stderr, "program '%s' not found in object\n", prog_name);
		return NULL;
	}
	/* With func_name, libbpf adds the offset to the function's. */
	link = bpf_program__attach_uprobe_opts(prog, -1, target, offset, &opts);
	if (!link)
		fprintf(stderr, "cannot attach uprobe %s:loop_sum+%zu: %s\n", target,
			offset, strerror(errno));
	return link;
}

int main(int argc, char **argv)
{
	struct loader_args args = { 0 };
	struct bpf_link *links[4] = { 0 };
	char obj_path[PATH_MAX];
	struct bpf_object *obj;
	struct bpf_map *counts;
	sigset_t signals;
	int err = 0;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;
	if (!args.target) {
		fprintf(stderr, "--target is required\n%s", usage);
		return 2;
	}
	if (!args.obj) {
		if (default_obj_path("usdt_count.bpf.o", obj_path, sizeof(obj_path)))
			return 1;
		args.obj = obj_path;
	}
	obj = open_and_load(args.obj);
	if (!obj)
		return 1;
	counts = must_find_map(obj, "counts");
	if (!counts) {
		err = 1;
		goto out;
	}

	block_exit_signals(&signals);
	links[0] = usdt(obj, "tick", args.target, "tick");
	links[1] = usdt(obj, "guarded", args.target, "guarded");
	links[2] = at_offset(obj, "at_nop", args.target, 2);
	links[3] = at_offset(obj, "at_head", args.target, 3);
	for (int i = 0; i < 4; i++)
		if (!links[i]) {
			err = 1;
			goto out;
		}

	announce_ready();
	wait_for_signal(&signals);

	/* Stop counting before we read, so the numbers hold still. */
	for (int i = 0; i < 4; i++) {
		bpf_link__destroy(links[i]);
		links[i] = NULL;
	}
	for (__u32 slot = 0; slot < SLOT_COUNT; slot++) {
		__u64 v = 0;

		if (bpf_map_lookup_elem(bpf_map__fd(counts), &slot, &v)) {
			fprintf(stderr, "cannot read slot %u: %s\n", slot, strerror(errno));
			err = 1;
			goto out;
		}
		printf("%s%s=%llu", slot ? " " : "", names[slot], (unsigned long long)v);
	}
	printf("\n");
	fflush(stdout);
out:
	for (int i = 0; i < 4; i++)
		bpf_link__destroy(links[i]);
	bpf_object__close(obj);
	return err;
}
