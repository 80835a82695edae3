// Reads several pt_regs fields (arguments, return address, stack pointer) into a map.
#include "tool.h"

struct regs_rec {
	u64 di, si, dx, ip, sp;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, struct regs_rec);
} last SEC(".maps");

SEC("uprobe")
int regs_snapshot(struct pt_regs *ctx)
{
	u32 pid = bpf_get_current_pid_tgid() >> 32;
	struct regs_rec r = {
		.di = PT_REGS_PARM1(ctx),
		.si = PT_REGS_PARM2(ctx),
		.dx = PT_REGS_PARM3(ctx),
		.ip = PT_REGS_IP(ctx),
		.sp = PT_REGS_SP(ctx),
	};

	bpf_map_update_elem(&last, &pid, &r, BPF_ANY);
	return 0;
}
