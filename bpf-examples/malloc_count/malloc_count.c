// SPDX-License-Identifier: MIT
/*
 * malloc_count: count malloc() calls and bytes per process with a uprobe.
 *
 * Usage: malloc_count [--target LIB] [--func NAME] [--obj FILE] [--sizes]
 *
 *   --target LIB  library (or binary) whose malloc to probe; default
 *                 "libc.so.6", resolved to the copy this loader runs with
 *   --func NAME   function to probe; default "malloc"
 *   --obj FILE    BPF object; default malloc_count.bpf.o beside the loader
 *   --sizes       also print how often each process asked for each size
 *
 * Prints "ready" once the probe is attached, then waits for SIGINT or
 * SIGTERM and prints the maps, one record per line, in no particular order:
 *
 *   pid=<tgid> calls=<n> bytes=<sum>
 *   pid=<tgid> size=<bytes> calls=<n>        (only with --sizes)
 *   total calls=<n> bytes=<sum>               (always last)
 */
#include <bpf/bpf.h>

#include "../common/loader.h"
#include "malloc_count.h"

static const char usage[] =
	"Usage: malloc_count [--target LIB] [--func NAME] [--obj FILE] [--sizes] [--verbose]\n"
	"Counts calls to LIB's malloc (default libc.so.6) and the bytes asked for,\n"
	"per process, until SIGINT/SIGTERM; then prints the counts.\n";

static void print_per_pid(int fd)
{
	struct malloc_stats stats;
	__u32 key, next;
	__u32 *prev = NULL;

	while (bpf_map_get_next_key(fd, prev, &next) == 0) {
		if (bpf_map_lookup_elem(fd, &next, &stats) == 0)
			printf("pid=%u calls=%llu bytes=%llu\n", next,
			       (unsigned long long)stats.calls,
			       (unsigned long long)stats.bytes);
		key = next;
		prev = &key;
	}
}

static void print_per_size(int fd)
{
	struct size_key key, next;
	struct size_key *prev = NULL;
	__u64 calls;

	while (bpf_map_get_next_key(fd, prev, &next) == 0) {
		if (bpf_map_lookup_elem(fd, &next, &calls) == 0)
			printf("pid=%u size=%llu calls=%llu\n", next.tgid,
			       (unsigned long long)next.size,
			       (unsigned long long)calls);
		key = next;
		prev = &key;
	}
}

static int print_totals(int fd)
{
	struct malloc_stats stats;
	__u32 slot = 0;

	if (bpf_map_lookup_elem(fd, &slot, &stats)) {
		fprintf(stderr, "cannot read totals: %s\n", strerror(errno));
		return -1;
	}
	printf("total calls=%llu bytes=%llu\n",
	       (unsigned long long)stats.calls,
	       (unsigned long long)stats.bytes);
	return 0;
}

int main(int argc, char **argv)
{
	struct loader_args args = { .target = "libc.so.6", .func = "malloc" };
	struct bpf_map *per_pid, *per_size, *totals;
	char obj_path[PATH_MAX], target[PATH_MAX];
	struct bpf_object *obj;
	struct bpf_link *link;
	sigset_t signals;
	int err;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;

	if (!args.obj) {
		if (default_obj_path("malloc_count.bpf.o", obj_path,
				     sizeof(obj_path)))
			return 1;
		args.obj = obj_path;
	}
	if (resolve_library(args.target, target, sizeof(target))) {
		fprintf(stderr, "cannot find %s; pass its path with --target\n",
			args.target);
		return 1;
	}

	obj = open_and_load(args.obj);
	if (!obj)
		return 1;

	per_pid = must_find_map(obj, "per_pid");
	per_size = must_find_map(obj, "per_size");
	totals = must_find_map(obj, "totals");
	if (!per_pid || !per_size || !totals) {
		err = 1;
		goto out;
	}

	block_exit_signals(&signals);
	link = attach_uprobe(obj, "count_malloc", target, args.func, false);
	if (!link) {
		err = 1;
		goto out;
	}

	announce_ready();
	wait_for_signal(&signals);

	/* Stop counting before we read, so the numbers hold still. */
	bpf_link__destroy(link);

	print_per_pid(bpf_map__fd(per_pid));
	if (args.sizes)
		print_per_size(bpf_map__fd(per_size));
	err = print_totals(bpf_map__fd(totals)) ? 1 : 0;
	fflush(stdout);
out:
	bpf_object__close(obj);
	return err;
}
