// Pushes call arguments to a queue and keeps the latest in a stack map.
#include "tool.h"

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, 256);
	__type(value, u64);
} pending SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK);
	__uint(max_entries, 16);
	__type(value, u64);
} recent SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(push_arg, u64 a)
{
	u64 v = a, old;

	if (bpf_map_push_elem(&pending, &v, 0))
		return 1;
	if (bpf_map_push_elem(&recent, &v, BPF_EXIST))
		return 2;
	if (!bpf_map_peek_elem(&recent, &old) && old == v)
		return 0;
	return 3;
}
