// SPDX-License-Identifier: MIT
/*
 * lru_hashcount: LRU hash maps inside a CUDA kernel. An LRU map that is full evicts an
 * entry not used lately to make room, on the GPU as in the kernel, so its updates never
 * fail for room.
 *
 *   bpftime run lru_hashcount.bpf.o -- vec_add [N] [ITERS] [BLOCK]
 *
 * by_lane: every thread of vectorAdd counts itself under threadIdx.x % 64 in an LRU map
 *   of 128 entries, which never fills: it counts as a hash map does, N / 64 * ITERS for
 *   each key.
 * recent: every thread puts its global index in an LRU map of 1024 entries: N keys per
 *   launch, so the map is full almost at once and evicts on nearly every update. It ends
 *   holding at most 1024 keys.
 * recent_percpu: the same in a per-CPU LRU map (a value per SM on the GPU).
 * outcome: [0] the updates of `recent` that succeeded, [1] those that failed: N * ITERS
 *   and none (a hash map of 1024 entries would refuse all but 1024); [2] and [3] the same
 *   for `recent_percpu`.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"

#define KEYS 64

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 128);
	__type(key, __u32);
	__type(value, __u64);
} by_lane SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} recent SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} recent_percpu SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} outcome SEC(".maps");

SEC("cuda:vectorAdd")
int count_thread(void *ctx)
{
	__u64 x, y, z, zero = 0, one = 1;

	bpf_get_thread_idx(&x, &y, &z);
	__u32 key = x % KEYS;
	__u64 *count = bpf_map_lookup_elem(&by_lane, &key);

	if (!count) {
		bpf_map_update_elem(&by_lane, &key, &zero, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&by_lane, &key);
	}
	if (count)
		__sync_fetch_and_add(count, 1);

	__u32 id = gpu_global_thread_x();
	__u32 slot = bpf_map_update_elem(&recent, &id, &one, BPF_ANY) == 0 ? 0 : 1;
	__u64 *n = bpf_map_lookup_elem(&outcome, &slot);

	if (n)
		__sync_fetch_and_add(n, 1);
	slot = bpf_map_update_elem(&recent_percpu, &id, &one, BPF_ANY) == 0 ? 2 : 3;
	n = bpf_map_lookup_elem(&outcome, &slot);
	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
