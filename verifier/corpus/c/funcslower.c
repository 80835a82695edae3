// Reports calls slower than a threshold (a .rodata constant) through a ring buffer.
#include "tool.h"

const volatile u64 min_ns = 1000;

struct event {
	u32 pid;
	u64 delta_ns;
	u64 ret;
	char comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u64);
	__type(value, u64);
} starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} events SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(slow_entry)
{
	u64 id = bpf_get_current_pid_tgid();
	u64 now = bpf_ktime_get_ns();

	bpf_map_update_elem(&starts, &id, &now, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int BPF_KRETPROBE(slow_exit, long ret)
{
	u64 id = bpf_get_current_pid_tgid();
	u64 *start = bpf_map_lookup_elem(&starts, &id);
	struct event *e;
	u64 delta;

	if (!start)
		return 0;
	delta = bpf_ktime_get_ns() - *start;
	bpf_map_delete_elem(&starts, &id);
	if (delta < min_ns)
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->pid = id >> 32;
	e->delta_ns = delta;
	e->ret = ret;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
	return 0;
}
