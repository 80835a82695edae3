#include "common.h"

MAP(out, BPF_MAP_TYPE_PERF_EVENT_ARRAY, 4, 4, 0);

struct sample {
	__u64 ts;
	__u32 a_count;
	__u32 len;
	char buf[32];
};

SEC("uprobe")
int scan(struct pt_regs *ctx)
{
	struct sample s = {};
	s.ts = bpf_ktime_get_ns();
	long n = bpf_probe_read_user_str(s.buf, sizeof(s.buf), (void *)PT_REGS_PARM1(ctx));
	if (n <= 0)
		return 0;
	s.len = n;
	for (int i = 0; i < sizeof(s.buf); i++)
		if (s.buf[i] == 'a')
			s.a_count++;
	bpf_perf_event_output(ctx, &out, BPF_F_CURRENT_CPU, &s, sizeof(s));
	return 0;
}
