// SPDX-License-Identifier: MIT
/*
 * cuda_counter: at the entry and the exit of every thread of the CUDA kernel vectorAdd,
 * count, and time each thread from entry to exit on the host's clock.
 *
 *   counts[0]  threads that entered        counts[1]  threads that exited
 *   counts[2]  sum of the threads' entry-to-exit times, in ns
 *   counts[3]  the longest of them
 *
 * A thread's entry time waits for its exit in `starts`, indexed by its global index
 * (the first 1<<20 threads of a launch are timed; every thread is counted). Run it with
 *   bpftime run cuda_counter.bpf.o -- vec_add [N] [ITERS]
 * entries and exits are then N rounded up to whole blocks, times ITERS.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"

#define TIMED_THREADS (1 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TIMED_THREADS);
	__type(key, __u32);
	__type(value, __u64);
} starts SEC(".maps");

static __always_inline void add(__u32 key, __u64 v)
{
	__u64 *slot = bpf_map_lookup_elem(&counts, &key);

	if (slot)
		__sync_fetch_and_add(slot, v);
}

SEC("cuda:vectorAdd")
int kernel_entry(void *ctx)
{
	__u32 t = gpu_global_thread_x();
	__u64 now = bpf_ktime_get_ns();

	add(0, 1);
	if (t < TIMED_THREADS)
		bpf_map_update_elem(&starts, &t, &now, BPF_ANY);
	return 0;
}

SEC("cuda:vectorAdd:exit")
int kernel_exit(void *ctx)
{
	__u32 t = gpu_global_thread_x();
	__u64 now = bpf_ktime_get_ns();

	add(1, 1);
	if (t < TIMED_THREADS) {
		__u64 *start = bpf_map_lookup_elem(&starts, &t);

		if (start && *start && now >= *start) {
			__u64 d = now - *start;
			__u32 max_key = 3;
			__u64 *max = bpf_map_lookup_elem(&counts, &max_key);

			add(2, d);
			if (max && d > *max)
				*max = d;
		}
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
