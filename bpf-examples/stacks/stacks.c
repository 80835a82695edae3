// SPDX-License-Identifier: MIT
/*
 * stacks: print the user-space call chains seen at the entry of (uprobe) and
 * return from (uretprobe) a function.
 *
 * Usage: stacks --target BINARY --func NAME [--outer CALLER]... [--obj FILE]
 *               [--verbose]
 *
 * Each --outer CALLER (up to four) gets a uretprobe that only counts, so that
 * it is pending while NAME's stacks are taken further down the same chain.
 *
 * Prints "ready" once attached, then one line per probe hit, in order:
 *
 *   entry arg=<a> len=<bytes> frames=<ip,...> skip1_len=<bytes> skip1=<ip,...>
 *   return len=<bytes> frames=<ip,...> skip1_len=<bytes> skip1=<ip,...>
 *
 * and at SIGINT/SIGTERM what every helper call answered, and the traces the
 * stack trace maps hold, by id:
 *
 *   result what=<n> ret=<id or -errno> count=<calls>   (what: see stacks.h)
 *   stack map=<name> id=<id> frames=<ip,...>
 *
 * Frames are printed in hex; a zero frame ends the list.
 */
#include <bpf/bpf.h>

#include "../common/loader.h"
#include "stacks.h"

static const char usage[] =
	"Usage: stacks --target BINARY --func NAME [--outer CALLER]... [--obj FILE]\n"
	"              [--verbose]\n"
	"Prints the user stack at every entry and return of NAME in BINARY\n"
	"until SIGINT/SIGTERM, then the stack trace maps. Each --outer CALLER\n"
	"gets a uretprobe too, pending while NAME runs.\n";


static void print_frames(const __u64 *frames, int n)
{
	for (int i = 0; i < n && frames[i]; i++)
		printf("%s%#llx", i ? "," : "", (unsigned long long)frames[i]);
}

static int handle_event(void *ctx, void *data, size_t size)
{
	const struct stack_event *e = data;

	(void)ctx;
	if (size < sizeof(*e))
		return 0;
	if (e->at_return)
		printf("return len=%lld frames=", (long long)e->len);
	else
		printf("entry arg=%u len=%lld frames=", e->arg, (long long)e->len);
	print_frames(e->frames, STACK_FRAMES);
	printf(" skip1_len=%lld skip1=", (long long)e->len_skip1);
	print_frames(e->frames_skip1, STACK_FRAMES - 1);
	printf("\n");
	return 0;
}

static int cmp_keys(const void *a, const void *b)
{
	const struct result_key *x = a, *y = b;

	if (x->what != y->what)
		return x->what < y->what ? -1 : 1;
	return x->ret < y->ret ? -1 : x->ret > y->ret;
}

static void print_results(int fd)
{
	struct result_key keys[256], next, *prev = NULL;
	int n = 0;

	while (n < 256 && bpf_map_get_next_key(fd, prev, &next) == 0) {
		keys[n] = next;
		prev = &keys[n++];
	}
	qsort(keys, n, sizeof(keys[0]), cmp_keys);
	for (int i = 0; i < n; i++) {
		__u64 count = 0;

		bpf_map_lookup_elem(fd, &keys[i], &count);
		printf("result what=%u ret=%d count=%llu\n", keys[i].what,
		       keys[i].ret, (unsigned long long)count);
	}
}

/* Stack trace map ids come back from get_next_key in increasing order. */
static void print_stacks(struct bpf_object *obj, const char *name)
{
	struct bpf_map *map = must_find_map(obj, name);
	__u32 id, *prev = NULL, key;
	__u64 frames[STACK_FRAMES];

	if (!map)
		return;
	while (bpf_map_get_next_key(bpf_map__fd(map), prev, &id) == 0) {
		if (bpf_map_lookup_elem(bpf_map__fd(map), &id, frames) == 0) {
			printf("stack map=%s id=%u frames=", name, id);
			print_frames(frames, STACK_FRAMES);
			printf("\n");
		}
		key = id;
		prev = &key;
	}
}

int main(int argc, char **argv)
{
	struct loader_args args = {};
	char obj_path[PATH_MAX], target[PATH_MAX];
	struct bpf_link *entry = NULL, *ret = NULL;
	struct bpf_link *outer[LOADER_MAX_OUTER] = {};
	struct ring_buffer *rb = NULL;
	struct bpf_map *events, *results;
	struct bpf_object *obj;
	int err;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;
	if (!args.target || !args.func) {
		fprintf(stderr, "--target and --func are required\n%s", usage);
		return 2;
	}
	if (!args.obj) {
		if (default_obj_path("stacks.bpf.o", obj_path, sizeof(obj_path)))
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
	events = must_find_map(obj, "events");
	results = must_find_map(obj, "results");
	if (!events || !results) {
		err = 1;
		goto out;
	}
	rb = ring_buffer__new(bpf_map__fd(events), handle_event, NULL, NULL);
	if (!rb) {
		fprintf(stderr, "cannot set up the ring buffer: %s\n",
			strerror(errno));
		err = 1;
		goto out;
	}

	catch_exit_signals();

	entry = attach_uprobe(obj, "on_entry", target, args.func, false);
	ret = attach_uprobe(obj, "on_return", target, args.func, true);
	if (!entry || !ret) {
		err = 1;
		goto out;
	}
	for (int i = 0; i < args.n_outer; i++) {
		outer[i] = attach_uprobe(obj, "on_outer_return", target,
					 args.outer[i], true);
		if (!outer[i]) {
			err = 1;
			goto out;
		}
	}
	announce_ready();

	while (!exit_requested) {
		err = ring_buffer__poll(rb, 100 /* ms */);
		if (err < 0 && err != -EINTR) {
			fprintf(stderr, "ring_buffer__poll: %s\n", strerror(-err));
			err = 1;
			goto out;
		}
	}
	bpf_link__destroy(entry);
	bpf_link__destroy(ret);
	entry = ret = NULL;
	for (int i = 0; i < args.n_outer; i++) {
		bpf_link__destroy(outer[i]);
		outer[i] = NULL;
	}
	ring_buffer__consume(rb);

	print_results(bpf_map__fd(results));
	print_stacks(obj, "stacks");
	print_stacks(obj, "tiny");
	print_stacks(obj, "tiny_reuse");
	print_stacks(obj, "pair_reuse");
	fflush(stdout);
	err = 0;
out:
	for (int i = 0; i < args.n_outer; i++)
		bpf_link__destroy(outer[i]);
	bpf_link__destroy(entry);
	bpf_link__destroy(ret);
	ring_buffer__free(rb);
	bpf_object__close(obj);
	return err;
}
