// SPDX-License-Identifier: MIT
/*
 * launchlate: how long after the CPU asks for a launch the kernel starts on the GPU, as
 * a log2 histogram in microseconds. A CPU uprobe on the CUDA runtime's launch call
 * stamps the host clock into `launched`: `__cudaLaunchKernel`, which a `<<<...>>>` launch
 * calls with CUDA 12.8 and newer (older ones, and explicit launches, call
 * `cudaLaunchKernel`: name it with --attach launch=cudaLaunchKernel), in the application,
 * where nvcc links cudart statically by default (with -cudart shared, --attach
 * launch=libcudart.so.13:__cudaLaunchKernel); the GPU entry probe of vectorAdd, in the first thread of the first block,
 * reads it back (the map is shared: the CPU's write reaches the launch it precedes) and
 * takes the difference on the same clock: bpf_ktime_get_ns on the GPU is the host's
 * CLOCK_MONOTONIC through a calibrated offset.
 *
 *   bpftime run launchlate.bpf.o -- vec_add [N] [ITERS]
 *
 * `latency_hist` holds the histogram (slot k: [2^k, 2^(k+1)) microseconds, slot 0 also below
 * 1 us); `stats` the launches seen on each side, the sum of the latencies in ns, and the
 * launches whose GPU start read earlier than the CPU's stamp (the clocks' error bound).
 *
 * Built with -DBPFTIME_GPU_ARRAYS (launchlate_gpu.bpf.o), the three maps are bpftime's GPU
 * arrays (map type 1503), as bpftime's own launchlate declares its histogram: one copy
 * that the CPU uprobe, the GPU probe and the host all see, exactly as an array.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "../common/gpu_helpers.h"

#define SLOTS 32

#ifdef BPFTIME_GPU_ARRAYS
#define SHARED_ARRAY 1503 /* bpftime's BPF_MAP_TYPE_GPU_ARRAY_MAP */
#else
#define SHARED_ARRAY BPF_MAP_TYPE_ARRAY
#endif

struct {
	__uint(type, SHARED_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} launched SEC(".maps");

struct {
	__uint(type, SHARED_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} latency_hist SEC(".maps");

/* 0: launches seen by the CPU, 1: kernels started on the GPU, 2: sum of latencies (ns),
 * 3: GPU starts stamped before the CPU's (negative latencies). */
struct {
	__uint(type, SHARED_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

static __always_inline void bump(__u32 key, __u64 v)
{
	__u64 *slot = bpf_map_lookup_elem(&stats, &key);

	if (slot)
		__sync_fetch_and_add(slot, v);
}

SEC("uprobe/__cudaLaunchKernel")
int launch(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&launched, &zero, &now, BPF_ANY);
	bump(0, 1);
	return 0;
}

SEC("cuda:vectorAdd")
int kernel_start(void *ctx)
{
	__u64 bx, by, bz, tx, ty, tz;

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	if (bx || by || bz || tx || ty || tz)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;
	__u64 *then = bpf_map_lookup_elem(&launched, &zero);

	if (!then || !*then)
		return 0;
	bump(1, 1);
	if (now < *then) {
		bump(3, 1);
		return 0;
	}
	__u64 ns = now - *then;
	__u64 us = ns / 1000;
	__u32 slot = 0;

	while (us > 1 && slot < SLOTS - 1) {
		us >>= 1;
		slot++;
	}
	__u64 *count = bpf_map_lookup_elem(&latency_hist, &slot);

	if (count)
		__sync_fetch_and_add(count, 1);
	bump(2, ns);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
