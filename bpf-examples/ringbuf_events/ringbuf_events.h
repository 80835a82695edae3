/* SPDX-License-Identifier: MIT */
/* Types shared by ringbuf_events.bpf.c (kernel side) and ringbuf_events.c. */
#ifndef RINGBUF_EVENTS_H
#define RINGBUF_EVENTS_H

/* How an event was written into the ring buffer. */
enum event_path {
	PATH_RESERVE = 0, /* bpf_ringbuf_reserve() + bpf_ringbuf_submit() */
	PATH_OUTPUT = 1,  /* bpf_ringbuf_output() of a copy on the stack */
};

/* One record in the `events` ring buffer. */
struct event {
	__u32 pid;  /* tgid of the caller */
	__u32 tid;  /* thread id of the caller */
	__s64 arg;  /* first argument of the probed function */
	__u64 ts;   /* bpf_ktime_get_ns() at entry */
	__u32 path; /* enum event_path */
	__u32 pad;
};

/* Slot of the `dropped` array: events lost because the ring was full. */
#define DROPPED_SLOT 0

#endif /* RINGBUF_EVENTS_H */
