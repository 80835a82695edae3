// Copies a user string argument into a ring buffer record; short ones are discarded.
#include "tool.h"

struct rec {
	u32 pid;
	u32 len;
	char text[64];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 14);
} out SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(str_arg, const char *s)
{
	struct rec *r = bpf_ringbuf_reserve(&out, sizeof(*r), 0);
	long n;

	if (!r)
		return 0;
	n = bpf_probe_read_user_str(r->text, sizeof(r->text), s);
	if (n <= 1) {
		bpf_ringbuf_discard(r, 0);
		return 0;
	}
	r->pid = bpf_get_current_pid_tgid() >> 32;
	r->len = n;
	bpf_ringbuf_submit(r, 0);
	return 0;
}
