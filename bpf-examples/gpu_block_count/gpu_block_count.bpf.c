// SPDX-License-Identifier: MIT
/*
 * A GPU probe: at the entry of the CUDA kernel vectorAdd, count how many times each
 * block starts, in an array map indexed by blockIdx.x. One thread per block (thread
 * (0, 0, 0)) counts, so a launch adds exactly 1 to each block's slot.
 *
 * `SEC("kprobe/<kernel>")` with a program name starting with `cuda__` is a GPU entry
 * probe (bpftime's convention). Helpers 503 and 505 are bpftime's GPU helpers; they
 * write x, y and z through the three pointers.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define MAX_BLOCKS 1024

static long (*bpf_get_block_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)503;
static long (*bpf_get_thread_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)505;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_BLOCKS);
	__type(key, __u32);
	__type(value, __u64);
} block_starts SEC(".maps");

SEC("kprobe/vectorAdd")
int cuda__block_starts(void *ctx)
{
	__u64 x, y, z;

	bpf_get_thread_idx(&x, &y, &z);
	if (x || y || z)
		return 0;
	bpf_get_block_idx(&x, &y, &z);
	__u32 key = x % MAX_BLOCKS;
	__u64 *count = bpf_map_lookup_elem(&block_starts, &key);
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
