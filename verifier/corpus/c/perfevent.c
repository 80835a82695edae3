// Sends a fixed-size record, built on the stack (padding and all), through a perf buffer.
#include "tool.h"

struct sample {
	u32 pid;
	u64 arg0;
	u16 cpu;
	u64 ts;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY);
	__uint(key_size, sizeof(u32));
	__uint(value_size, sizeof(u32));
} samples SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(sample_call, u64 a0)
{
	struct sample s;

	s.pid = bpf_get_current_pid_tgid() >> 32;
	s.arg0 = a0;
	s.cpu = bpf_get_smp_processor_id();
	s.ts = bpf_ktime_get_ns();
	bpf_perf_event_output(ctx, &samples, BPF_F_CURRENT_CPU, &s, sizeof(s));
	return 0;
}
