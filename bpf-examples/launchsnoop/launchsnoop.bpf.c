// SPDX-License-Identifier: MIT
/*
 * launchsnoop: every CUDA kernel launch of a process, with its GPU time. A launch
 * program (SEC("cuda:KERNEL:launch"), here every kernel) runs on the CPU at each launch
 * call and again once the kernel completed, with its GPU start and end on the host clock
 * (../common/cuda_launch.h). Kernels without PTX (stock PyTorch, cuBLAS) are seen too.
 *
 *   bpftime run launchsnoop.bpf.o -- APP [ARGS]
 *
 * `events` gets a record per completed launch: the kernel's name, grid and block, the time
 * from the launch call to the kernel's start on the GPU and the kernel's GPU time. `stats`
 * holds the totals listed below; `gpu_us` a log2 histogram of GPU times in microseconds.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/cuda_launch.h"

#define SLOTS 32

struct launch_event {
	__u64 launch_id;
	__u64 cpu_ns;		/* the launch call */
	__u64 queued_ns;	/* from the call to the kernel's start on the GPU */
	__u64 gpu_ns;		/* the kernel's GPU time */
	__u32 grid[3];
	__u32 block[3];
	__u32 shared_mem_bytes;
	__u32 clock_error_ns;
	char name[BPFTIME_LAUNCH_NAME_BYTES];
};

/* Puts the record's type in the object's BTF, so tools print records field by field. */
const struct launch_event *launch_event_type __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} events SEC(".maps");

/* 0: launch calls, 1: completed launches, 2: sum of GPU times (ns), 3: longest GPU time
 * (ns), 4: sum of call-to-start times (ns), 5: completions that started before their call
 * by more than the clock's error bound, 6: threads launched (grid x block, summed),
 * 7: launch calls the driver failed, 8: completions without a launch-time run before them,
 * 9: largest clock error bound (ns). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 10);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} gpu_us SEC(".maps");

/* Launches between their two runs: launch id -> the call's time. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, __u64);
} in_flight SEC(".maps");

static __always_inline void add(__u32 key, __u64 v)
{
	__u64 *slot = bpf_map_lookup_elem(&stats, &key);

	if (slot)
		__sync_fetch_and_add(slot, v);
}

static __always_inline void raise_to(__u32 key, __u64 v)
{
	__u64 *slot = bpf_map_lookup_elem(&stats, &key);

	if (slot && *slot < v)
		*slot = v;
}

SEC("cuda:*:launch")
int launch(struct bpftime_cuda_launch *ctx)
{
	__u64 id = ctx->launch_id;

	if (ctx->phase == BPFTIME_LAUNCH_CALLED) {
		add(0, 1);
		if (ctx->result) {
			add(7, 1);
			return 0;
		}
		add(6, (__u64)ctx->grid[0] * ctx->grid[1] * ctx->grid[2] * ctx->block[0] *
			       ctx->block[1] * ctx->block[2]);
		__u64 called = ctx->cpu_ns;
		bpf_map_update_elem(&in_flight, &id, &called, BPF_ANY);
		return 0;
	}

	/* Completed. */
	if (!bpf_map_lookup_elem(&in_flight, &id))
		add(8, 1);
	bpf_map_delete_elem(&in_flight, &id);
	__u64 start = ctx->gpu_start_ns, end = ctx->gpu_end_ns;
	__u64 gpu = end > start ? end - start : 0;
	__u64 queued = 0;

	add(1, 1);
	add(2, gpu);
	raise_to(3, gpu);
	raise_to(9, ctx->clock_error_ns);
	if (start + ctx->clock_error_ns < ctx->cpu_ns)
		add(5, 1);
	else if (start > ctx->cpu_ns)
		queued = start - ctx->cpu_ns;
	add(4, queued);

	__u64 us = gpu / 1000;
	__u32 slot = 0;

	while (us > 1 && slot < SLOTS - 1) {
		us >>= 1;
		slot++;
	}
	__u64 *count = bpf_map_lookup_elem(&gpu_us, &slot);

	if (count)
		__sync_fetch_and_add(count, 1);

	struct launch_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e)
		return 0;
	e->launch_id = id;
	e->cpu_ns = ctx->cpu_ns;
	e->queued_ns = queued;
	e->gpu_ns = gpu;
	e->grid[0] = ctx->grid[0];
	e->grid[1] = ctx->grid[1];
	e->grid[2] = ctx->grid[2];
	e->block[0] = ctx->block[0];
	e->block[1] = ctx->block[1];
	e->block[2] = ctx->block[2];
	e->shared_mem_bytes = ctx->shared_mem_bytes;
	e->clock_error_ns = ctx->clock_error_ns;
	__builtin_memcpy(e->name, ctx->name, sizeof(e->name));
	bpf_ringbuf_submit(e, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
