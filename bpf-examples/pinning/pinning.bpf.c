// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * pinning: a uprobe counting calls into a map that libbpf pins by name
 * (LIBBPF_PIN_BY_NAME), so that it outlives the loader and a later loader
 * reuses it; `scratch` is an ordinary map the loader pins by hand.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "pinning.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PINNING_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} scratch SEC(".maps");

SEC("uprobe")
int count_call(struct pt_regs *ctx)
{
	__u32 slot = 0;
	__u64 *v = bpf_map_lookup_elem(&counts, &slot);

	if (v)
		__sync_fetch_and_add(v, 1);
	v = bpf_map_lookup_elem(&scratch, &slot);
	if (v)
		__sync_fetch_and_add(v, 1);
	return 0;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
