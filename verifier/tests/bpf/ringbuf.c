#include "common.h"

struct event {
	__u32 pid;
	__u64 arg1, arg2;
	char comm[16];
	char path[64];
};

MAP(events, BPF_MAP_TYPE_RINGBUF, 0, 0, 256 * 1024);

SEC("uprobe")
int on_open(struct pt_regs *ctx)
{
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	e->arg1 = PT_REGS_PARM1(ctx);
	e->arg2 = PT_REGS_PARM2(ctx);
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	if (bpf_probe_read_user_str(e->path, sizeof(e->path), (void *)e->arg1) < 0) {
		bpf_ringbuf_discard(e, 0);
		return 0;
	}
	bpf_ringbuf_submit(e, 0);
	return 0;
}
