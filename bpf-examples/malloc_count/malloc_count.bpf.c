// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * malloc_count: count malloc() calls and requested bytes.
 *
 * A uprobe on libc's malloc() runs count_malloc() at every call, in every
 * process that uses that libc. It updates three maps:
 *
 *   per_pid   hash  tgid            -> { calls, bytes }
 *   per_size  hash  { tgid, size }  -> calls
 *   totals    array [0]             -> { calls, bytes } over all processes
 *
 * The program uses maps only (no global variables), so it needs nothing but
 * the bpf() map and program commands from whatever runs it.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "malloc_count.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 10240);
	__type(key, __u32);
	__type(value, struct malloc_stats);
} per_pid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct size_key);
	__type(value, __u64);
} per_size SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct malloc_stats);
} totals SEC(".maps");

/*
 * Return the value stored under `key`, creating a zeroed one first if there
 * is none. BPF_NOEXIST makes the insert safe when two CPUs race: the loser's
 * insert fails and both then share the winner's value.
 */
static __always_inline void *lookup_or_init(void *map, const void *key,
					    const void *zero)
{
	void *value = bpf_map_lookup_elem(map, key);

	if (value)
		return value;
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, key);
}

/* libbpf 1.1 has no BPF_UPROBE yet; BPF_KPROBE is the same thing for
 * uprobes (both receive a struct pt_regs) and names the arguments.
 * The loaders attach this to malloc() themselves; the section says the same
 * for `bpftime run`, which attaches programs where their sections say. */
SEC("uprobe/libc.so.6:malloc")
int BPF_KPROBE(count_malloc, unsigned long size)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct size_key skey = { .tgid = tgid, .size = size };
	struct malloc_stats zero = {}, *stats;
	__u64 zero_count = 0, *count;
	__u32 slot = 0;

	stats = lookup_or_init(&per_pid, &tgid, &zero);
	if (stats) {
		__sync_fetch_and_add(&stats->calls, 1);
		__sync_fetch_and_add(&stats->bytes, size);
	}

	count = lookup_or_init(&per_size, &skey, &zero_count);
	if (count)
		__sync_fetch_and_add(count, 1);

	stats = bpf_map_lookup_elem(&totals, &slot);
	if (stats) {
		__sync_fetch_and_add(&stats->calls, 1);
		__sync_fetch_and_add(&stats->bytes, size);
	}
	return 0;
}

/* GPL-compatible, so the kernel lets us use any helper. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";
