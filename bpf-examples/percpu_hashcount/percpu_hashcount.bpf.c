// SPDX-License-Identifier: MIT
/*
 * percpu_hashcount: per-CPU hash maps inside a CUDA kernel, shared with the CPU. On the
 * GPU a per-CPU hash keeps a value per key and SM (bpf_get_smp_processor_id() is the SM);
 * the store keeps one per host CPU, SM s's changes are added into CPU s % N's (N the
 * host's possible CPUs), and a CPU c's change reaches SM c % SMs, so a tool that sums a
 * key's values over CPUs, as tools do, gets every side's total.
 *
 *   bpftime run percpu_hashcount.bpf.o -- vec_add [N] [ITERS] [BLOCK]
 *
 * by_lane: every thread of vectorAdd counts itself under threadIdx.x % 64, inserting the
 *   key if it is missing: all the threads of a launch race to insert the same 64 keys.
 *   Summed over CPUs, each key holds N / 64 * ITERS.
 * from_cpu: written by the CPU between launches, by a launch program that runs on the
 *   launching thread right after each launch call. Key 0 is made by the CPU after the
 *   first launch call, holding 1000000 on its CPU; every thread of every later launch
 *   finds it and adds 1: 1000000 + N * (ITERS - 1) over CPUs. Key 1 holds the number of
 *   launch calls made so far, written on the CPU making the call; a thread that sees a
 *   value there (on the SM that CPU's values go to) counts it in seen[value]: launch k
 *   (from 1) sees k - 1, so seen[1..ITERS-1] are counted and seen[ITERS] never.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"
#include "../common/cuda_launch.h"

#define KEYS 64
#define SEEN 64

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} by_lane SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} from_cpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SEEN);
	__type(key, __u32);
	__type(value, __u64);
} seen SEC(".maps");

/* The launch calls made so far (the CPU's own count). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} calls SEC(".maps");

SEC("cuda:vectorAdd")
int count_thread(void *ctx)
{
	__u64 x, y, z, zero = 0;
	__u32 key, made = 0, launches = 1;

	bpf_get_thread_idx(&x, &y, &z);
	key = x % KEYS;
	__u64 *count = bpf_map_lookup_elem(&by_lane, &key);

	if (!count) {
		bpf_map_update_elem(&by_lane, &key, &zero, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&by_lane, &key);
	}
	if (count)
		__sync_fetch_and_add(count, 1);

	__u64 *v = bpf_map_lookup_elem(&from_cpu, &made);

	if (v)
		__sync_fetch_and_add(v, 1);
	v = bpf_map_lookup_elem(&from_cpu, &launches);
	if (v) {
		__u32 n = *v;

		if (n > 0 && n < SEEN) {
			__u64 *s = bpf_map_lookup_elem(&seen, &n);

			if (s)
				__sync_fetch_and_add(s, 1);
		}
	}
	return 0;
}

SEC("cuda:vectorAdd:launch")
int after_call(struct bpftime_cuda_launch *launch)
{
	__u32 zero = 0, made = 0, launches = 1;
	__u64 start = 1000000, n;

	if (launch->phase != BPFTIME_LAUNCH_CALLED)
		return 0;
	__u64 *c = bpf_map_lookup_elem(&calls, &zero);

	if (!c)
		return 0;
	n = __sync_fetch_and_add(c, 1) + 1;
	/* Made once, by the first call; later calls find it (EEXIST) and leave it. */
	bpf_map_update_elem(&from_cpu, &made, &start, BPF_NOEXIST);
	bpf_map_update_elem(&from_cpu, &launches, &n, BPF_ANY);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
