// Counts calls per process (hash) and in total (per-CPU array).
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, u32);
	__type(value, u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} total SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(count_call)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	u32 zero = 0;
	u64 one = 1, *v;

	v = bpf_map_lookup_elem(&counts, &pid);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(&counts, &pid, &one, BPF_NOEXIST);

	v = bpf_map_lookup_elem(&total, &zero);
	if (v)
		*v += 1;
	return 0;
}
