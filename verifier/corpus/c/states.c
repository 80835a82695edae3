// A per-thread state machine driven by call arguments, stored in an LRU hash.
#include "tool.h"

enum state { IDLE, OPEN, READING, WRITING, CLOSED };

struct conn {
	u32 state;
	u32 transitions;
	u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 512);
	__type(key, u64);
	__type(value, struct conn);
} conns SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(step, u32 event, u64 n)
{
	u64 id = bpf_get_current_pid_tgid();
	struct conn fresh = {}, *c = bpf_map_lookup_elem(&conns, &id);

	if (!c) {
		bpf_map_update_elem(&conns, &id, &fresh, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&conns, &id);
		if (!c)
			return 0;
	}
	switch (c->state) {
	case IDLE:
		if (event == 1)
			c->state = OPEN;
		break;
	case OPEN:
		c->state = event == 2 ? READING : event == 3 ? WRITING : OPEN;
		break;
	case READING:
	case WRITING:
		c->bytes += n;
		if (event == 4)
			c->state = CLOSED;
		break;
	default:
		bpf_map_delete_elem(&conns, &id);
		return 0;
	}
	c->transitions++;
	return c->state;
}
