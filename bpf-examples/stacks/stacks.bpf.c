// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * stacks: user-space call chains at a uprobe and a uretprobe.
 *
 * At the entry of the probed function, `on_entry` files the user stack in
 * stack trace maps with bpf_get_stackid (with and without collisions, reuse
 * and skipped frames) and copies it with bpf_get_stack into a ring buffer
 * event; `on_return` copies the stack at the return. Every return value of
 * the helpers is counted in `results`, so the loader can print what each
 * call answered. `on_outer_return` goes on callers of the probed function,
 * so that their uretprobes are pending while its stacks are taken.
 *
 * The sections name stack_target's functions for `bpftime run`; the loader
 * attaches where --target, --func and --outer say.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "stacks.h"

#define TRACE_BYTES (STACK_FRAMES * sizeof(__u64))

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 64);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, TRACE_BYTES);
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, TRACE_BYTES);
} tiny SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, TRACE_BYTES);
} tiny_reuse SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 2);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, TRACE_BYTES);
} pair_reuse SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct result_key);
	__type(value, __u64);
} results SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

static __always_inline void count(__u32 what, long ret)
{
	struct result_key key = { .what = what, .ret = (__s32)ret };
	__u64 zero = 0, *n;

	/* Insert 0 then add, so that two CPUs finding the key missing at once both count
	 * (the loser's insert fails with EEXIST; an insert of 1 would lose its count). */
	n = bpf_map_lookup_elem(&results, &key);
	if (!n) {
		bpf_map_update_elem(&results, &key, &zero, BPF_NOEXIST);
		n = bpf_map_lookup_elem(&results, &key);
	}
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void copy_stack(void *ctx, struct stack_event *e)
{
	e->len = bpf_get_stack(ctx, e->frames, sizeof(e->frames), BPF_F_USER_STACK);
	e->len_skip1 = bpf_get_stack(ctx, e->frames_skip1, sizeof(e->frames_skip1),
				     BPF_F_USER_STACK | 1);
}

SEC("uprobe/leaf")
int BPF_KPROBE(on_entry, int arg)
{
	__u64 odd[2];
	struct stack_event *e;

	count(WHAT_STACKID, bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK));
	count(WHAT_STACKID_SKIP1, bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK | 1));
	count(WHAT_TINY, bpf_get_stackid(ctx, &tiny, BPF_F_USER_STACK));
	count(WHAT_TINY_REUSE, bpf_get_stackid(ctx, &tiny_reuse,
					       BPF_F_USER_STACK | BPF_F_REUSE_STACKID));
	count(WHAT_PAIR_REUSE, bpf_get_stackid(ctx, &pair_reuse,
					       BPF_F_USER_STACK | BPF_F_REUSE_STACKID));
	count(WHAT_KERNEL_STACKID, bpf_get_stackid(ctx, &stacks, 0));
	count(WHAT_BAD_FLAGS, bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK | (1ULL << 12)));
	count(WHAT_KERNEL_STACK, bpf_get_stack(ctx, odd, sizeof(odd), 0));
	count(WHAT_ODD_SIZE, bpf_get_stack(ctx, odd, 12, BPF_F_USER_STACK));

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->at_return = 0;
	e->arg = arg;
	copy_stack(ctx, e);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

SEC("uretprobe/leaf")
int BPF_KRETPROBE(on_return)
{
	struct stack_event *e;

	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->at_return = 1;
	e->arg = 0;
	copy_stack(ctx, e);
	bpf_ringbuf_submit(e, 0);
	return 0;
}

/*
 * A uretprobe on a caller of the probed function, only counted: while the
 * probed function runs, the caller's return address on the stack is the
 * uretprobe's trampoline, and the stacks taken above must still show the
 * real one, as the kernel does.
 */
SEC("uretprobe/mid")
int BPF_KRETPROBE(on_outer_return)
{
	count(WHAT_OUTER_RETURN, 0);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
