// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * What a syscall tracepoint on getppid costs, for scripts/bench-syscall.sh: one object
 * per variant.
 *   -DCOST_EMPTY    tracepoint/syscalls/sys_enter_getppid, a program that does nothing
 *   -DCOST_COUNT    the same tracepoint counting into this CPU's slot of a per-CPU array
 *                   (bpftrace's `@c = count()`)
 *   -DCOST_RAWCOUNT raw_tracepoint/sys_enter counting getppid's calls by number into a
 *                   per-CPU array (syscount's shape; it runs at every system call)
 *   -DCOST_OTHER    an empty program on another call's tracepoint (sys_enter_openat):
 *                   the hooks are armed, getppid itself is not watched
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#if defined(COST_COUNT) || defined(COST_RAWCOUNT)
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 512);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *count = bpf_map_lookup_elem(&counts, &slot);

	if (count)
		*count += 1;
}
#endif

#ifdef COST_RAWCOUNT
SEC("raw_tracepoint/sys_enter")
int cost(struct bpf_raw_tracepoint_args *ctx)
{
	count(ctx->args[1]);
	return 0;
}
#elif defined(COST_OTHER)
SEC("tracepoint/syscalls/sys_enter_openat")
int cost(void *ctx)
{
	return 0;
}
#else
SEC("tracepoint/syscalls/sys_enter_getppid")
int cost(void *ctx)
{
#ifdef COST_COUNT
	count(110);
#endif
	return 0;
}
#endif

char LICENSE[] SEC("license") = "Dual MIT/GPL";
