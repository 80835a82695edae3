// SPDX-License-Identifier: MIT
/*
 * access_shared: every global and shared-memory access of vectorAdd(a, b, c, n), of the
 * tiled matmul(a, b, c, n) (bpf-examples/cuda, 16 x 16 tiles in two __shared__ arrays) and
 * of matrix_rows (matrix loads and stores, at the end),
 * counted by kind and space, to check SEC("cuda:KERNEL:ldst.shared") against a count by
 * hand. Per launch:
 *   vectorAdd over n elements:  n loads in a, n in b, n stores in c; nothing shared
 *   matmul of n x n:            per thread and tile step (n^2 threads, n/16 steps): one
 *                               load in a, one in b, 2 shared stores, 2 x 16 shared loads;
 *                               then n^2 stores in c
 *
 *   bpftime run access_shared.bpf.o -- matmul [N] [ITERS]
 *
 * vector_add[] and matmul[]:
 *   0 global loads in a     1 global loads in b     2 global stores in c
 *   3 shared loads          4 shared stores
 *   5 any other access (another kind, a global one outside a, b and c, another space)
 *   6 shared accesses whose address is not a generic one (a window offset, or inside
 *     a, b or c)
 *   7 accesses of a size other than 4
 *   8 accesses counted
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_access.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 9);
	__type(key, __u32);
	__type(value, __u64);
} vector_add SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 9);
	__type(key, __u32);
	__type(value, __u64);
} matmul SEC(".maps");

/* A block's shared window is at most 228 KiB: a shared address below this is an offset
 * in it, not the generic address a tool can tell buffers apart by. */
#define SHARED_WINDOW_MAX (256 << 10)

static __always_inline void add(void *stats, __u32 key)
{
	__u64 *n = bpf_map_lookup_elem(stats, &key);

	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline void classify(void *stats, void *ctx, __u64 bytes)
{
	const struct bpftime_gpu_access *acc = bpftime_gpu_access(ctx);
	const __u64 *regs = ctx;
	__u64 a = regs[14], b = regs[13], c = regs[12], addr = acc->addr;
	__u32 kind = acc->kind, space = acc->space;

	add(stats, 8);
	if (acc->size != 4)
		add(stats, 7);
	if (space == BPFTIME_GPU_SHARED) {
		if (addr < SHARED_WINDOW_MAX || addr - a < bytes || addr - b < bytes ||
		    addr - c < bytes)
			add(stats, 6);
		if (kind == BPFTIME_GPU_LOAD)
			add(stats, 3);
		else if (kind == BPFTIME_GPU_STORE)
			add(stats, 4);
		else
			add(stats, 5);
	} else if (space != BPFTIME_GPU_GLOBAL) {
		add(stats, 5);
	} else if (addr - a < bytes && kind == BPFTIME_GPU_LOAD) {
		add(stats, 0);
	} else if (addr - b < bytes && kind == BPFTIME_GPU_LOAD) {
		add(stats, 1);
	} else if (addr - c < bytes && kind == BPFTIME_GPU_STORE) {
		add(stats, 2);
	} else {
		add(stats, 5);
	}
}

SEC("cuda:vectorAdd:ldst.shared")
int vector_add_access(void *ctx)
{
	__u64 n = (__u32)((const __u64 *)ctx)[11];

	classify(&vector_add, ctx, n * 4);
	return 0;
}

SEC("cuda:matmul:ldst.shared")
int matmul_access(void *ctx)
{
	__u64 n = (__u32)((const __u64 *)ctx)[11];

	classify(&matmul, ctx, n * n * 4);
	return 0;
}

/*
 * matrix_rows[] (bpf-examples/cuda/matrix_rows.cu: ldmatrix and stmatrix, each of the
 * lanes that name a row accessing its 16 bytes):
 *   0 shared loads of 16 bytes    1 shared stores of 16 bytes
 *   2 shared loads of 2 bytes     3 global loads of 16 bytes    4 global stores of 4 bytes
 *   5 any other access
 *   6 shared accesses whose address is not a generic one, or a 16-byte one not 16-aligned
 *   7 accesses counted
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, __u64);
} matrix_rows SEC(".maps");

SEC("cuda:matrix_rows:ldst.shared")
int matrix_rows_access(void *ctx)
{
	const struct bpftime_gpu_access *acc = bpftime_gpu_access(ctx);
	__u64 addr = acc->addr;
	__u32 kind = acc->kind, size = acc->size;

	add(&matrix_rows, 7);
	if (acc->space == BPFTIME_GPU_SHARED) {
		if (addr < SHARED_WINDOW_MAX || (size == 16 && (addr & 15)))
			add(&matrix_rows, 6);
		if (kind == BPFTIME_GPU_LOAD && size == 16)
			add(&matrix_rows, 0);
		else if (kind == BPFTIME_GPU_STORE && size == 16)
			add(&matrix_rows, 1);
		else if (kind == BPFTIME_GPU_LOAD && size == 2)
			add(&matrix_rows, 2);
		else
			add(&matrix_rows, 5);
	} else if (kind == BPFTIME_GPU_LOAD && size == 16) {
		add(&matrix_rows, 3);
	} else if (kind == BPFTIME_GPU_STORE && size == 4) {
		add(&matrix_rows, 4);
	} else {
		add(&matrix_rows, 5);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
