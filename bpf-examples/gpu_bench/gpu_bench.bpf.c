// SPDX-License-Identifier: MIT
/*
 * The probes the GPU overhead benchmark (scripts/gpu.sh) measures; each is built into an
 * object of its own (-DBENCH_EMPTY, -DBENCH_COUNT, -DBENCH_EXIT_TIME) so that one runs at
 * a time, on vectorAdd or, with `--attach PROG=matmul`, another kernel:
 *   empty        an entry probe that does nothing
 *   count        every thread adds 1 to one counter (an array value)
 *   exit_time    every thread adds its entry-to-exit time to a total; the entry time
 *                waits in a hash map keyed by the thread's global index
 *   ldst_count   a memory-access probe: every global load and store adds 1 to the
 *                counter of its kind (aggregated on the GPU, as memtrace's maps are)
 *   ldst_ring    a memory-access probe: every global load and store sends its address,
 *                size and kind to the host through a ring buffer (full rings drop)
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"
#include "../common/gpu_access.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << 20);
	__type(key, __u32);
	__type(value, __u64);
} entered SEC(".maps");

#ifdef BENCH_EMPTY
SEC("cuda:vectorAdd")
int empty(void *ctx)
{
	return 0;
}
#endif

#ifdef BENCH_COUNT
SEC("cuda:vectorAdd")
int count(void *ctx)
{
	__u32 key = 0;
	__u64 *total = bpf_map_lookup_elem(&totals, &key);

	if (total)
		__sync_fetch_and_add(total, 1);
	return 0;
}
#endif

#ifdef BENCH_EXIT_TIME
SEC("cuda:vectorAdd")
int exit_time_entry(void *ctx)
{
	__u32 t = gpu_global_thread_x() & ((1 << 20) - 1);
	__u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&entered, &t, &now, BPF_ANY);
	return 0;
}

SEC("cuda:vectorAdd:exit")
int exit_time(void *ctx)
{
	__u32 t = gpu_global_thread_x() & ((1 << 20) - 1);
	__u64 *start = bpf_map_lookup_elem(&entered, &t);
	__u32 key = 1;
	__u64 *total = bpf_map_lookup_elem(&totals, &key);

	if (start && total)
		__sync_fetch_and_add(total, bpf_ktime_get_ns() - *start);
	return 0;
}
#endif

#ifdef BENCH_LDST_COUNT
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} kinds SEC(".maps");

SEC("cuda:vectorAdd:ldst")
int ldst_count(void *ctx)
{
	__u32 kind = bpftime_gpu_access(ctx)->kind;
	__u64 *n = bpf_map_lookup_elem(&kinds, &kind);

	if (n)
		__sync_fetch_and_add(n, 1);
	return 0;
}
#endif

#ifdef BENCH_LDST_RING
struct access_event {
	__u64 addr;
	__u32 size;
	__u32 kind;
};

const struct access_event *access_event_type __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} accesses SEC(".maps");

SEC("cuda:vectorAdd:ldst")
int ldst_ring(void *ctx)
{
	const struct bpftime_gpu_access *a = bpftime_gpu_access(ctx);
	struct access_event e = { .addr = a->addr, .size = a->size, .kind = a->kind };

	bpf_ringbuf_output(&accesses, &e, sizeof(e), 0);
	return 0;
}
#endif

char LICENSE[] SEC("license") = "GPL";
