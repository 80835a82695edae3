// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * rejected: a program that every verifier, the kernel's and ours, must refuse.
 * It reads the value a hash map lookup returns without checking that the
 * lookup found one, which dereferences NULL whenever the key is absent.
 * The tests of `bpftime verify` and `bpftime run` load it.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

SEC("uprobe/work")
int read_without_check(void *ctx)
{
	__u32 key = 0;
	__u64 *value = bpf_map_lookup_elem(&counts, &key);

	/* The check that is missing: if (!value) return 0; */
	return *value;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
