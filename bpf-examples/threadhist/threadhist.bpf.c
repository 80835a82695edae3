// SPDX-License-Identifier: MIT
/*
 * threadhist: how many threads of the CUDA kernel vectorAdd exited, by threadIdx.x.
 * After `vec_add N ITERS BLOCK`, every index below BLOCK holds ITERS times the number
 * of blocks (N rounded up to whole blocks).
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"

#define MAX_THREADS 1024

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_THREADS);
	__type(key, __u32);
	__type(value, __u64);
} exits_by_thread SEC(".maps");

SEC("cuda:vectorAdd:exit")
int thread_exit(void *ctx)
{
	__u64 x, y, z;

	bpf_get_thread_idx(&x, &y, &z);
	__u32 key = x;
	__u64 *count = bpf_map_lookup_elem(&exits_by_thread, &key);

	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
