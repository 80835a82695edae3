// SPDX-License-Identifier: MIT
/*
 * hashstarts: each thread's entry time in a hash map keyed by the thread, inserted at
 * the kernel's entry and deleted at its exit, as tools time calls on the CPU. A GPU hash
 * table does not reuse a deleted slot within a launch, so it runs out of empty slots
 * after as many inserts as it has slots unless it is laid out anew between launches:
 * with 256 threads a launch and a map of 1024 entries (2048 slots), the ninth launch
 * would find none. Run it with
 *   bpftime run hashstarts.bpf.o -- vec_add 256 50 256
 *
 *   outcome[0]  inserts that succeeded     outcome[1]  inserts that failed
 *   outcome[2]  exits that found their start and deleted it
 *   outcome[3]  exits that did not
 *   outcome[4]  sum of the threads' entry-to-exit times, in ns
 * expected: 256 x 50 = 12800 inserts and found starts, no failure, and `starts` empty.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_helpers.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 5);
	__type(key, __u32);
	__type(value, __u64);
} outcome SEC(".maps");

static __always_inline void add(__u32 key, __u64 v)
{
	__u64 *slot = bpf_map_lookup_elem(&outcome, &key);

	if (slot)
		__sync_fetch_and_add(slot, v);
}

SEC("cuda:vectorAdd")
int start_thread(void *ctx)
{
	__u32 t = gpu_global_thread_x();
	__u64 now = bpf_ktime_get_ns();

	add(bpf_map_update_elem(&starts, &t, &now, BPF_NOEXIST) == 0 ? 0 : 1, 1);
	return 0;
}

SEC("cuda:vectorAdd:exit")
int end_thread(void *ctx)
{
	__u32 t = gpu_global_thread_x();
	__u64 now = bpf_ktime_get_ns();
	__u64 *start = bpf_map_lookup_elem(&starts, &t);

	if (start && now >= *start && bpf_map_delete_elem(&starts, &t) == 0) {
		add(2, 1);
		add(4, now - *start);
	} else {
		add(3, 1);
	}
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
