// SPDX-License-Identifier: MIT
/*
 * funclatency: log2 histogram of a function's run time (uprobe + uretprobe).
 *
 * Usage: funclatency --target BINARY --func NAME [--obj FILE]
 *
 *   --target BINARY  executable or library that defines the function
 *                    (a bare "libfoo.so.1" is resolved like malloc_count does)
 *   --func NAME      the function to time
 *   --obj FILE       BPF object; default funclatency.bpf.o beside the loader
 *
 * Prints "ready" once both probes are attached, then waits for SIGINT or
 * SIGTERM and prints:
 *
 *   count=<completed calls>
 *   total_ns=<sum of their durations>
 *   missed=<returns without a recorded entry>
 *   hist lo=<ns> hi=<ns> count=<n>     one line per non-empty bucket,
 *                                      shortest first; lo <= duration <= hi
 */
#include <bpf/bpf.h>

#include "../common/loader.h"
#include "funclatency.h"

static const char usage[] =
	"Usage: funclatency --target BINARY --func NAME [--obj FILE] [--verbose]\n"
	"Times every call of NAME in BINARY until SIGINT/SIGTERM, then prints\n"
	"the call count and a log2 histogram of durations in nanoseconds.\n";

static int read_u64(int fd, __u32 slot, __u64 *value)
{
	if (bpf_map_lookup_elem(fd, &slot, value)) {
		fprintf(stderr, "cannot read map slot %u: %s\n", slot,
			strerror(errno));
		return -1;
	}
	return 0;
}

static int print_results(int stats_fd, int hist_fd)
{
	__u64 count, total, missed, n;
	__u32 slot;

	if (read_u64(stats_fd, STAT_COUNT, &count) ||
	    read_u64(stats_fd, STAT_TOTAL_NS, &total) ||
	    read_u64(stats_fd, STAT_MISSED, &missed))
		return -1;
	printf("count=%llu\n", (unsigned long long)count);
	printf("total_ns=%llu\n", (unsigned long long)total);
	printf("missed=%llu\n", (unsigned long long)missed);

	for (slot = 0; slot < HIST_SLOTS; slot++) {
		unsigned long long lo = slot ? 1ULL << slot : 0;
		unsigned long long hi = (1ULL << slot) * 2 - 1;

		if (read_u64(hist_fd, slot, &n))
			return -1;
		if (n)
			printf("hist lo=%llu hi=%llu count=%llu\n", lo, hi,
			       (unsigned long long)n);
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct loader_args args = {};
	struct bpf_link *entry = NULL, *exit_link = NULL;
	char obj_path[PATH_MAX], target[PATH_MAX];
	struct bpf_map *stats, *hist;
	struct bpf_object *obj;
	sigset_t signals;
	int err;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;
	if (!args.target || !args.func) {
		fprintf(stderr, "--target and --func are required\n%s", usage);
		return 2;
	}
	if (!args.obj) {
		if (default_obj_path("funclatency.bpf.o", obj_path,
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
	stats = must_find_map(obj, "stats");
	hist = must_find_map(obj, "hist");
	if (!stats || !hist) {
		err = 1;
		goto out;
	}

	block_exit_signals(&signals);
	/* Attach the return probe first, so every call whose entry we record
	 * is also seen returning; calls already running are only "missed". */
	exit_link = attach_uprobe(obj, "func_exit", target, args.func, true);
	if (exit_link)
		entry = attach_uprobe(obj, "func_entry", target, args.func,
				      false);
	if (!entry) {
		err = 1;
		goto out;
	}

	announce_ready();
	wait_for_signal(&signals);

	bpf_link__destroy(entry);
	entry = NULL;
	bpf_link__destroy(exit_link);
	exit_link = NULL;

	err = print_results(bpf_map__fd(stats), bpf_map__fd(hist)) ? 1 : 0;
	fflush(stdout);
out:
	bpf_link__destroy(entry);
	bpf_link__destroy(exit_link);
	bpf_object__close(obj);
	return err;
}
