// SPDX-License-Identifier: MIT
/*
 * smcount: a per-CPU array inside a CUDA kernel. On the GPU a per-CPU map keeps a value
 * per SM (bpf_get_smp_processor_id() is the SM); the store keeps one per host CPU, and
 * SM s's value is added into CPU s % N's (N the host's possible CPUs), so a tool that
 * sums a per-CPU value over CPUs, as tools do, gets the GPU's total. All threads on one
 * SM share its value, up to 2048 at once, so a GPU program adds to it atomically (on a
 * CPU, one program runs per CPU at a time).
 *
 *   bpftime run smcount.bpf.o -- vec_add [N] [ITERS]
 *
 * `exits` (per-CPU) and `by_sm` (an array indexed by SM) both count vectorAdd's threads
 * at exit: the first summed over CPUs, the second over SMs.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define MAX_SMS 1024

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} exits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SMS);
	__type(key, __u32);
	__type(value, __u64);
} by_sm SEC(".maps");

SEC("cuda:vectorAdd:exit")
int sm_exit(void *ctx)
{
	__u32 zero = 0, sm = bpf_get_smp_processor_id();
	__u64 *v = bpf_map_lookup_elem(&exits, &zero);

	if (v)
		__sync_fetch_and_add(v, 1);
	v = bpf_map_lookup_elem(&by_sm, &sm);
	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
