// SPDX-License-Identifier: MIT
/*
 * ringbuf_events: print one line per call of a function, via a BPF ring
 * buffer that this loader polls with ring_buffer__poll().
 *
 * Usage: ringbuf_events --target BINARY --func NAME [--obj FILE]
 *
 *   --target BINARY  executable or library that defines the function
 *   --func NAME      the function to watch
 *   --obj FILE       BPF object; default ringbuf_events.bpf.o beside us
 *
 * Prints "ready" once attached, then one line per event as it arrives:
 *
 *   event pid=<tgid> tid=<tid> arg=<first argument> ts=<ns> via=<reserve|output>
 *
 * and, after SIGINT or SIGTERM (remaining events are drained first):
 *
 *   events=<events printed>
 *   dropped=<events lost because the ring buffer was full>
 *   disorder=<events whose argument was not above the previous one of their thread>
 *
 * RINGBUF_EVENTS_MODE picks how it waits for records, as tools do:
 *   poll     ring_buffer__poll(rb, 100) (the default)
 *   epoll    epoll_wait() on ring_buffer__epoll_fd(), then ring_buffer__consume()
 *   consume  ring_buffer__consume() every 100 us, never waiting on the ring
 *
 * `arg` is the whole 64-bit first-argument register, printed signed.
 */
#include <bpf/bpf.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "../common/loader.h"
#include "ringbuf_events.h"

static const char usage[] =
	"Usage: ringbuf_events --target BINARY --func NAME [--obj FILE] [--verbose]\n"
	"Prints an event line for every call of NAME in BINARY until\n"
	"SIGINT/SIGTERM, then the number of events.\n";

static unsigned long long event_count, disorder;

/* The last argument seen per thread: targets call work(0), work(1), ... on each thread,
 * so a thread's events arrive in increasing order or the ring reordered them. */
#define THREAD_SLOTS 1024
static struct {
	__u32 tid;
	long long last;
} seen[THREAD_SLOTS];

static void check_order(__u32 tid, long long arg)
{
	unsigned i = tid % THREAD_SLOTS, n;

	for (n = 0; n < THREAD_SLOTS; n++, i = (i + 1) % THREAD_SLOTS) {
		if (seen[i].tid == tid) {
			if (arg <= seen[i].last)
				disorder++;
			seen[i].last = arg;
			return;
		}
		if (seen[i].tid == 0) {
			seen[i].tid = tid;
			seen[i].last = arg;
			return;
		}
	}
}

/* Called by libbpf for every record in the ring buffer. */
static int handle_event(void *ctx, void *data, size_t size)
{
	const struct event *e = data;

	(void)ctx;
	if (size < sizeof(*e)) {
		fprintf(stderr, "short event: %zu bytes\n", size);
		return 0;
	}
	printf("event pid=%u tid=%u arg=%lld ts=%llu via=%s\n", e->pid,
	       e->tid, (long long)e->arg, (unsigned long long)e->ts,
	       e->path == PATH_RESERVE ? "reserve" : "output");
	check_order(e->tid, (long long)e->arg);
	event_count++;
	return 0;
}

int main(int argc, char **argv)
{
	struct loader_args args = {};
	char obj_path[PATH_MAX], target[PATH_MAX];
	struct ring_buffer *rb = NULL;
	struct bpf_map *events, *dropped;
	struct bpf_link *link = NULL;
	struct bpf_object *obj;
	__u32 slot = DROPPED_SLOT;
	__u64 lost = 0;
	int err;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;
	if (!args.target || !args.func) {
		fprintf(stderr, "--target and --func are required\n%s", usage);
		return 2;
	}
	if (!args.obj) {
		if (default_obj_path("ringbuf_events.bpf.o", obj_path,
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
	events = must_find_map(obj, "events");
	dropped = must_find_map(obj, "dropped");
	if (!events || !dropped) {
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

	link = attach_uprobe(obj, "on_call", target, args.func, false);
	if (!link) {
		err = 1;
		goto out;
	}
	announce_ready();

	const char *mode = getenv("RINGBUF_EVENTS_MODE");
	int epoll_fd = ring_buffer__epoll_fd(rb);

	while (!exit_requested) {
		const char *what = "ring_buffer__poll";

		if (mode && strcmp(mode, "epoll") == 0) {
			struct epoll_event ev;
			int n = epoll_wait(epoll_fd, &ev, 1, 100);

			what = "epoll_wait";
			err = n < 0 ? -errno : 0;
			if (n > 0) {
				what = "ring_buffer__consume";
				err = ring_buffer__consume(rb);
			}
		} else if (mode && strcmp(mode, "consume") == 0) {
			what = "ring_buffer__consume";
			err = ring_buffer__consume(rb);
			usleep(100);
		} else {
			err = ring_buffer__poll(rb, 100 /* ms */);
		}
		if (err < 0 && err != -EINTR) {
			fprintf(stderr, "%s: %s\n", what, strerror(-err));
			err = 1;
			goto out;
		}
	}

	/* Stop producing, then drain what is still in the ring: with
	 * RINGBUF_EVENTS_FINAL_POLL set, by one more poll with timeout 0, as many
	 * tools do (it finds whatever the ring holds, since the kernel's rings are
	 * readable whenever they hold data); else by ring_buffer__consume(). */
	bpf_link__destroy(link);
	link = NULL;
	if (getenv("RINGBUF_EVENTS_FINAL_POLL"))
		err = ring_buffer__poll(rb, 0);
	else
		err = ring_buffer__consume(rb);
	if (err < 0) {
		fprintf(stderr, "ring_buffer__consume: %s\n", strerror(-err));
		err = 1;
		goto out;
	}
	bpf_map_lookup_elem(bpf_map__fd(dropped), &slot, &lost);
	printf("events=%llu\n", event_count);
	printf("dropped=%llu\n", (unsigned long long)lost);
	printf("disorder=%llu\n", disorder);
	fflush(stdout);
	err = 0;
out:
	bpf_link__destroy(link);
	ring_buffer__free(rb);
	bpf_object__close(obj);
	return err;
}
