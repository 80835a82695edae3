// SPDX-License-Identifier: MIT
/*
 * access_check: every global access of vectorAdd(a, b, c, n) and matmul(a, b, c, n)
 * (bpf-examples/cuda) sorted by the buffer it falls in, to check memory-access probes
 * against a count by hand:
 *   vectorAdd over n elements:  n loads in a, n loads in b, n stores in c
 *   matmul of n x n:            n^3/16 loads in a and in b (16 x 16 tiles), n^2 stores in c
 * per launch, and nothing anywhere else.
 *
 *   bpftime run access_check.bpf.o -- vec_add [N] [ITERS]
 *
 * vector_add[] and matmul[]:
 *   0 loads in a   1 loads in b   2 stores in c   3 other accesses inside a, b or c
 *   4 accesses outside the three buffers          5 accesses of a size other than 4
 *   6 accesses counted
 * vector_add_bytes[], the bytes those accesses of vectorAdd move (a bulk copy's are many):
 *   0 loaded from a   1 loaded from b   2 stored into c   3 reduced into c
 *   4 any other access's
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_access.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 7);
	__type(key, __u32);
	__type(value, __u64);
} vector_add SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 7);
	__type(key, __u32);
	__type(value, __u64);
} matmul SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} vector_add_bytes SEC(".maps");

static __always_inline void add_n(void *stats, __u32 key, __u64 by)
{
	__u64 *n = bpf_map_lookup_elem(stats, &key);

	if (n)
		__sync_fetch_and_add(n, by);
}

static __always_inline void add(void *stats, __u32 key)
{
	add_n(stats, key, 1);
}

static __always_inline void classify(void *stats, void *ctx, __u64 bytes)
{
	const struct bpftime_gpu_access *acc = bpftime_gpu_access(ctx);
	const __u64 *regs = ctx;
	__u64 a = regs[14], b = regs[13], c = regs[12], addr = acc->addr;
	__u32 kind = acc->kind;

	add(stats, 6);
	if (acc->size != 4)
		add(stats, 5);
	if (addr - a < bytes)
		add(stats, kind == BPFTIME_GPU_LOAD ? 0 : 3);
	else if (addr - b < bytes)
		add(stats, kind == BPFTIME_GPU_LOAD ? 1 : 3);
	else if (addr - c < bytes)
		add(stats, kind == BPFTIME_GPU_STORE ? 2 : 3);
	else
		add(stats, 4);
}

SEC("cuda:vectorAdd:ldst")
int vector_add_access(void *ctx)
{
	__u64 n = (__u32)((const __u64 *)ctx)[11];

	const struct bpftime_gpu_access *acc = bpftime_gpu_access(ctx);
	const __u64 *regs = ctx;
	__u64 addr = acc->addr;
	__u32 kind = acc->kind, key = 4;

	classify(&vector_add, ctx, n * 4);
	if (addr - regs[14] < n * 4 && kind == BPFTIME_GPU_LOAD)
		key = 0;
	else if (addr - regs[13] < n * 4 && kind == BPFTIME_GPU_LOAD)
		key = 1;
	else if (addr - regs[12] < n * 4 && kind == BPFTIME_GPU_STORE)
		key = 2;
	else if (addr - regs[12] < n * 4 && kind == BPFTIME_GPU_REDUCTION)
		key = 3;
	add_n(&vector_add_bytes, key, acc->size);
	return 0;
}

SEC("cuda:matmul:ldst")
int matmul_access(void *ctx)
{
	__u64 n = (__u32)((const __u64 *)ctx)[11];

	classify(&matmul, ctx, n * n * 4);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
