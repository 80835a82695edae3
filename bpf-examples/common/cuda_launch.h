/* SPDX-License-Identifier: MIT */
/*
 * The context of a launch program, SEC("cuda:KERNEL:launch"): a CPU program that bpftime
 * runs at each launch of the CUDA kernels KERNEL names (a mangled or demangled name, or a
 * glob), for every kernel, whether or not it carries PTX.
 *
 * It runs twice per launch, with the same launch_id:
 *   phase BPFTIME_LAUNCH_CALLED    on the launching thread, right after the launch call
 *                                  returned (result is the driver's CUresult); the CPU
 *                                  stack there is the code path that launched the kernel;
 *   phase BPFTIME_LAUNCH_COMPLETED once the kernel completed, on bpftime's own thread, with
 *                                  gpu_start_ns and gpu_end_ns filled in.
 * A launch that failed, or that was captured into a CUDA graph, gets no completed run.
 *
 * Times are CLOCK_MONOTONIC nanoseconds, the clock bpf_ktime_get_ns() reads; the GPU times
 * are within clock_error_ns of the truth either way (CUDA events recorded around the
 * launch, calibrated against the host clock).
 */
#ifndef BPFTIME_CUDA_LAUNCH_H
#define BPFTIME_CUDA_LAUNCH_H

#include <linux/types.h>

#define BPFTIME_LAUNCH_CALLED 0
#define BPFTIME_LAUNCH_COMPLETED 1
#define BPFTIME_LAUNCH_NAME_BYTES 68

struct bpftime_cuda_launch {
	__u64 launch_id;	/* unique in the process */
	__u64 function;		/* the CUfunction launched */
	__u64 stream;		/* the CUstream: 0 legacy default, 2 per-thread default */
	__u32 grid[3];
	__u32 block[3];
	__u32 shared_mem_bytes;	/* dynamic shared memory */
	__s32 device;		/* the device's ordinal */
	__u64 cpu_ns;		/* when the launch call was made */
	__u64 gpu_start_ns;	/* completed run only */
	__u64 gpu_end_ns;	/* completed run only */
	__u32 clock_error_ns;
	__u32 phase;		/* BPFTIME_LAUNCH_CALLED or BPFTIME_LAUNCH_COMPLETED */
	__u32 result;		/* CUresult of the launch call */
	__u32 name_len;		/* bytes before the name's NUL */
	__u32 kernel_id;	/* FNV-1a of the whole mangled name: struct bpftime_gpu_access's */
	char name[BPFTIME_LAUNCH_NAME_BYTES]; /* mangled, cut to 67 bytes, NUL-terminated */
};

#endif
