// SPDX-License-Identifier: MIT
/*
 * printk: attach a program that calls bpf_printk to a function, and wait.
 *
 * Usage: printk --target BINARY --func NAME [--obj FILE] [--verbose]
 *
 * Prints "ready" once attached, then waits for SIGINT/SIGTERM. The output
 * goes to the trace pipe (/sys/kernel/tracing/trace_pipe on the kernel,
 * `bpftime trace-pipe` under bpftime).
 */
#include "../common/loader.h"
#include "printk.h"

static const char usage[] =
	"Usage: printk --target BINARY --func NAME [--obj FILE] [--verbose]\n"
	"Writes two trace pipe lines per call of NAME in BINARY until SIGINT/SIGTERM.\n";

int main(int argc, char **argv)
{
	struct loader_args args = {};
	char obj_path[PATH_MAX], target[PATH_MAX];
	struct bpf_object *obj;
	struct bpf_link *link;
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
		if (default_obj_path("printk.bpf.o", obj_path, sizeof(obj_path)))
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
	block_exit_signals(&signals);
	link = attach_uprobe(obj, "on_call", target, args.func, false);
	if (!link) {
		bpf_object__close(obj);
		return 1;
	}
	announce_ready();
	wait_for_signal(&signals);
	bpf_link__destroy(link);
	bpf_object__close(obj);
	return 0;
}
