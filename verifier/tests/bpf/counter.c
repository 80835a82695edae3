#include "common.h"

MAP(counts, BPF_MAP_TYPE_HASH, 4, 8, 1024);

SEC("uprobe")
int count_calls(struct pt_regs *ctx)
{
	__u32 pid = bpf_get_current_pid_tgid() >> 32;
	__u64 one = 1, *v = bpf_map_lookup_elem(&counts, &pid);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(&counts, &pid, &one, BPF_ANY);
	return 0;
}
