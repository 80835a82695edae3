/* SPDX-License-Identifier: MIT */
/*
 * What gpu_maps' BPF side and its loader share: bpftime's GPU map type numbers (its
 * runtime/include/bpftime_shm.hpp: GPU_MAP_OFFSET 1500 plus a standard type), the
 * slots of the `totals` array, and the record the exit probe writes into `events`.
 */
#ifndef GPU_MAPS_H
#define GPU_MAPS_H

#define BPFTIME_MAP_TYPE_GPU_HASH 1501
#define BPFTIME_MAP_TYPE_GPU_PER_THREAD_ARRAY 1502
#define BPFTIME_MAP_TYPE_GPU_ARRAY 1503
#define BPFTIME_MAP_TYPE_GPU_RINGBUF 1527

/* Keys of the per-thread array `per_thread`. */
enum gpu_maps_per_thread_key {
	PT_CALLS,	/* the thread's entries, counted without atomics */
	PT_ID,		/* the thread's global id + 1, written with bpf_map_update_elem */
	PT_KEYS,
};

/* Slots of the GPU array `totals`. */
enum gpu_maps_total {
	TOTAL_ENTRIES,	/* GPU threads that entered vectorAdd */
	TOTAL_ELEMENTS,	/* the sum of `n` over them */
	TOTAL_EXITS,	/* GPU threads that left it */
	TOTAL_RECORDS_REFUSED,	/* exits whose record bpf_perf_event_output refused */
	TOTAL_SLOTS,
};

/* The GPU hash map `by_block` holds one key per blockIdx.x % BY_BLOCK_KEYS. */
#define BY_BLOCK_KEYS 8

/* One record per thread at its exit. */
struct gpu_maps_event {
	__u32 global_id;	/* blockIdx.x * blockDim.x + threadIdx.x */
	__u32 block;		/* blockIdx.x */
	__u32 thread;		/* threadIdx.x */
	__u32 n;		/* vectorAdd's fourth argument */
	__u64 magic;		/* GPU_MAPS_MAGIC: the record arrived whole */
};

#define GPU_MAPS_MAGIC 0x6770756d61707321ull /* "gpumaps!" */

#endif
