// SPDX-License-Identifier: MIT
/*
 * gpu_maps: bpftime's GPU map types, each written in a way its loader (gpu_maps.c) can
 * check exactly after launches of vectorAdd of a known shape. The programs are spelled
 * as bpftime's own GPU programs are (`cuda__*` programs in `kprobe/` and `kretprobe/`
 * sections, map types by number), so that libbpf loads them unchanged.
 *
 * - `per_thread` (1502): every GPU thread has its own copy of each value. At entry a
 *   thread adds 1 to its PT_CALLS value by a plain read and write (no other thread
 *   shares it), and writes its global id + 1 into PT_ID with bpf_map_update_elem.
 * - `totals` (1503): one array shared by every thread and the host; entries, the sum of
 *   `n`, exits, counted with atomic adds.
 * - `by_block` (1501): one hash map shared by every thread; a count of threads per
 *   blockIdx.x % 8, its keys inserted by whichever thread comes first.
 * - `events` (1527): a record per thread at its exit through bpf_perf_event_output with a
 *   NULL context, as bpftime's kernelretsnoop writes it; the loader reads it with
 *   bpftime's poll function (or libbpf's ring buffer, `--ring-buffer`).
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "gpu_maps.h"
#include "../common/gpu_helpers.h"

struct {
	__uint(type, BPFTIME_MAP_TYPE_GPU_PER_THREAD_ARRAY);
	__uint(max_entries, PT_KEYS);
	__type(key, __u32);
	__type(value, __u64);
} per_thread SEC(".maps");

struct {
	__uint(type, BPFTIME_MAP_TYPE_GPU_ARRAY);
	__uint(max_entries, TOTAL_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

struct {
	__uint(type, BPFTIME_MAP_TYPE_GPU_HASH);
	__uint(max_entries, 2 * BY_BLOCK_KEYS);
	__type(key, __u32);
	__type(value, __u64);
} by_block SEC(".maps");

/* Room for 8 records of each thread the map is made for. */
struct {
	__uint(type, BPFTIME_MAP_TYPE_GPU_RINGBUF);
	__uint(max_entries, 8);
	__type(key, __u32);
	__type(value, struct gpu_maps_event);
} events SEC(".maps");

static __always_inline void add_total(__u32 slot, __u64 by)
{
	__u64 *v = bpf_map_lookup_elem(&totals, &slot);

	if (v)
		__sync_fetch_and_add(v, by);
}

SEC("kprobe/vectorAdd")
int cuda__gpu_maps_entry(struct pt_regs *ctx)
{
	__u64 bx, by, bz;
	__u32 key = PT_CALLS;
	__u64 *calls = bpf_map_lookup_elem(&per_thread, &key);

	if (calls)
		*calls += 1;
	__u64 id = gpu_global_thread_x() + 1;

	key = PT_ID;
	bpf_map_update_elem(&per_thread, &key, &id, BPF_ANY);

	add_total(TOTAL_ENTRIES, 1);
	add_total(TOTAL_ELEMENTS, PT_REGS_PARM4(ctx));

	bpf_get_block_idx(&bx, &by, &bz);
	__u32 block_key = bx % BY_BLOCK_KEYS;
	__u64 *count = bpf_map_lookup_elem(&by_block, &block_key);

	if (!count) {
		__u64 zero = 0;

		/* Many threads race to insert the key; one insert makes it. */
		bpf_map_update_elem(&by_block, &block_key, &zero, BPF_NOEXIST);
		count = bpf_map_lookup_elem(&by_block, &block_key);
	}
	if (count)
		__sync_fetch_and_add(count, 1);
	return 0;
}

SEC("kretprobe/vectorAdd")
int cuda__gpu_maps_exit(struct pt_regs *ctx)
{
	struct gpu_maps_event e = {};
	__u64 bx, by, bz, tx, ty, tz;

	bpf_get_block_idx(&bx, &by, &bz);
	bpf_get_thread_idx(&tx, &ty, &tz);
	e.global_id = gpu_global_thread_x();
	e.block = bx;
	e.thread = tx;
	e.n = PT_REGS_PARM4(ctx);
	e.magic = GPU_MAPS_MAGIC;
	add_total(TOTAL_EXITS, 1);
	if (bpf_perf_event_output(NULL, &events, 0, &e, sizeof(e)))
		add_total(TOTAL_RECORDS_REFUSED, 1);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
