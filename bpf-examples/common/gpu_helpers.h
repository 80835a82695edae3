/* SPDX-License-Identifier: MIT */
/*
 * bpftime's GPU helpers (ids 501-511, DESIGN.md's compatibility contract), for programs
 * that run inside CUDA kernels. 503, 504, 505 and 508 write x, y and z through the
 * three pointers and return 0.
 */
#ifndef BPFTIME_GPU_HELPERS_H
#define BPFTIME_GPU_HELPERS_H

#include <linux/types.h>

static long (*bpf_get_globaltimer)(void) = (void *)502;
static long (*bpf_get_block_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)503;
static long (*bpf_get_block_dim)(__u64 *x, __u64 *y, __u64 *z) = (void *)504;
static long (*bpf_get_thread_idx)(__u64 *x, __u64 *y, __u64 *z) = (void *)505;
static long (*bpf_get_grid_dim)(__u64 *x, __u64 *y, __u64 *z) = (void *)508;
static long (*bpf_get_sm_id)(void) = (void *)509;

/* The thread's index in a one-dimensional launch: blockIdx.x * blockDim.x + threadIdx.x. */
static __always_inline __u64 gpu_global_thread_x(void)
{
	__u64 bx, by, bz, dx, dy, dz, tx, ty, tz;

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_block_dim(&dx, &dy, &dz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	return bx * dx + tx;
}

#endif
