// SPDX-License-Identifier: MIT
/*
 * tensor_copies: the global accesses of tma_copy's kernel (bpf-examples/cuda/tma_copy.cu),
 * whose only global memory traffic is tensor copies (`cp.async.bulk.tensor.2d`): each row
 * of a copy's box that lies in the tensor is one access of that row's bytes, a load of
 * `in` or a store into `out`. Against a count by hand, per launch of a W x H float tensor
 * in B-column tiles: H rows per column of tiles loaded and stored, W * H * 4 bytes each
 * way, and nothing outside the two buffers.
 *
 *   bpftime run tensor_copies.bpf.o -- tma_copy [ITERS]
 *
 * tensor_copies[]:
 *   0 rows loaded from in    1 bytes loaded from in
 *   2 rows stored into out   3 bytes stored into out
 *   4 accesses of another kind, outside their buffer, or of a size that is not a whole
 *     number of floats up to a box row (128 bytes)
 *   5 accesses counted
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_access.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 6);
	__type(key, __u32);
	__type(value, __u64);
} tensor_copies SEC(".maps");

static __always_inline void add(__u32 key, __u64 by)
{
	__u64 *n = bpf_map_lookup_elem(&tensor_copies, &key);

	if (n)
		__sync_fetch_and_add(n, by);
}

/* tma_double(in_map, out_map, in, out, bytes, tiles_x): `in`, `out` and `bytes` are the
 * third to fifth parameters. */
SEC("cuda:tma_double:ldst")
int tensor_access(void *ctx)
{
	const struct bpftime_gpu_access *acc = bpftime_gpu_access(ctx);
	const __u64 *regs = ctx;
	__u64 in = regs[12], out = regs[11], bytes = regs[9];
	__u64 addr = acc->addr, size = acc->size;

	add(5, 1);
	if (size == 0 || size > 128 || size % 4 != 0) {
		add(4, 1);
		return 0;
	}
	if (acc->kind == BPFTIME_GPU_LOAD && addr - in < bytes && addr + size - in <= bytes) {
		add(0, 1);
		add(1, size);
	} else if (acc->kind == BPFTIME_GPU_STORE && addr - out < bytes &&
		   addr + size - out <= bytes) {
		add(2, 1);
		add(3, size);
	} else {
		add(4, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
