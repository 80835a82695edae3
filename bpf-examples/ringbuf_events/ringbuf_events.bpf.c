// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * ringbuf_events: stream one event per call of a function to user space.
 *
 * on_call (uprobe) sends { pid, tid, first argument, timestamp } through a
 * BPF_MAP_TYPE_RINGBUF. To show both ring buffer APIs, calls with an even
 * first argument use bpf_ringbuf_reserve()/bpf_ringbuf_submit() (the event
 * is written in place, no copy) and calls with an odd one build the event
 * on the stack and copy it in with bpf_ringbuf_output(). Events that do
 * not fit are counted in `dropped`.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "ringbuf_events.h"

#ifndef RING_BYTES
#define RING_BYTES (256 * 1024)
#endif

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RING_BYTES); /* bytes; a power of 2 pages */
} events SEC(".maps");

/* Puts struct event in the object's BTF (a ring buffer's records carry no type), so
 * `bpftime run` prints each record field by field. */
const struct event *event_type __attribute__((unused));

#ifdef EVERY
/* Built with -DEVERY=K (ringbuf_sparse.bpf.o): only one call in K is an event. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped SEC(".maps");

static __always_inline void count_drop(void)
{
	__u32 slot = DROPPED_SLOT;
	__u64 *value = bpf_map_lookup_elem(&dropped, &slot);

	if (value)
		__sync_fetch_and_add(value, 1);
}

/* The loaders attach this where --func says; `bpftime run` attaches it where
 * the section says: work() in the app. */
SEC("uprobe/work")
int BPF_KPROBE(on_call, long arg)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct event *e, copy = {};
#ifdef EVERY
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&calls, &zero);

	if (!n || __sync_fetch_and_add(n, 1) % EVERY)
		return 0;
#endif

	if ((arg & 1) == 0) {
		/* Zero-copy path: reserve space, fill it, submit it. */
		e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count_drop();
			return 0;
		}
		e->pid = id >> 32;
		e->tid = (__u32)id;
		e->arg = arg;
		e->ts = bpf_ktime_get_ns();
		e->path = PATH_RESERVE;
		e->pad = 0;
		bpf_ringbuf_submit(e, 0);
		return 0;
	}

	/* Copy path: build the event on the stack, then copy it in. */
	copy.pid = id >> 32;
	copy.tid = (__u32)id;
	copy.arg = arg;
	copy.ts = bpf_ktime_get_ns();
	copy.path = PATH_OUTPUT;
	if (bpf_ringbuf_output(&events, &copy, sizeof(copy), 0))
		count_drop();
	return 0;
}

/* GPL-compatible, so the kernel lets us use any helper. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";
