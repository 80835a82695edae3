// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * funclatency: how long does a function take?
 *
 * func_entry (uprobe) records bpf_ktime_get_ns() in `starts`, keyed by the
 * calling thread (pid_tgid: a thread can only be in one call at a time per
 * nesting level; recursion is not handled). func_exit (uretprobe) takes
 * the start time back out, and adds the duration to a log2 histogram
 * (`hist`) and to `stats`.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "funclatency.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, __u64);   /* pid_tgid of the calling thread */
	__type(value, __u64); /* entry time, ns */
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HIST_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} hist SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STAT_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

/* floor(log2(v)) for v > 0, and 0 for v == 0, without loops. */
static __always_inline __u32 log2_u64(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xffffffffULL) << 5; v >>= shift; r |= shift;
	shift = (v > 0xffff) << 4; v >>= shift; r |= shift;
	shift = (v > 0xff) << 3; v >>= shift; r |= shift;
	shift = (v > 0xf) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline void add_stat(__u32 slot, __u64 delta)
{
	__u64 *value = bpf_map_lookup_elem(&stats, &slot);

	if (value)
		__sync_fetch_and_add(value, delta);
}

/*
 * The loaders attach these where --func says; the sections name work() (in
 * the app) only for `bpftime run`, which attaches programs where their
 * sections say.
 */
SEC("uprobe/work")
int BPF_KPROBE(func_entry)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&starts, &id, &now, BPF_ANY);
	return 0;
}

SEC("uretprobe/work")
int BPF_KRETPROBE(func_exit)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *start, delta, *slot_count;
	__u32 slot;

	start = bpf_map_lookup_elem(&starts, &id);
	if (!start) {
		/* Attached while the call was already running. */
		add_stat(STAT_MISSED, 1);
		return 0;
	}
	delta = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&starts, &id);

	slot = log2_u64(delta);
	if (slot >= HIST_SLOTS)
		slot = HIST_SLOTS - 1;
	slot_count = bpf_map_lookup_elem(&hist, &slot);
	if (slot_count)
		__sync_fetch_and_add(slot_count, 1);

	add_stat(STAT_COUNT, 1);
	add_stat(STAT_TOTAL_NS, delta);
	return 0;
}

/* GPL-compatible, so the kernel lets us use any helper. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";
