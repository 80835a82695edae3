// SPDX-License-Identifier: MIT
/*
 * hashcount: every thread of the CUDA kernel vectorAdd counts itself in a hash map
 * under threadIdx.x % 64, inserting the key if it is missing. All the threads of a launch
 * race to insert the same 64 keys at once, so the map ends up right only if concurrent
 * inserts of one key make one entry: after `vec_add N ITERS 256`, 64 keys, each holding
 * N / 64 * ITERS.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"

#define KEYS 64

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} by_lane SEC(".maps");

SEC("cuda:vectorAdd")
int count_thread(void *ctx)
{
	__u64 x, y, z, zero = 0;

	bpf_get_thread_idx(&x, &y, &z);
	__u32 key = x % KEYS;
	__u64 *count = bpf_map_lookup_elem(&by_lane, &key);

	if (!count) {
		bpf_map_update_elem(&by_lane, &key, &zero, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&by_lane, &key);
	}
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
