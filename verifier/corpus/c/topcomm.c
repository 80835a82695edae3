// Counts calls by command name: a 16-byte hash key filled by a helper.
#include "tool.h"

struct comm_key {
	char comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct comm_key);
	__type(value, u64);
} by_comm SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(by_command)
{
	struct comm_key k = {};
	u64 zero = 0, *v;

	bpf_get_current_comm(&k.comm, sizeof(k.comm));
	v = bpf_map_lookup_elem(&by_comm, &k);
	if (!v) {
		bpf_map_update_elem(&by_comm, &k, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&by_comm, &k);
		if (!v)
			return 0;
	}
	__sync_fetch_and_add(v, 1);
	return 0;
}
