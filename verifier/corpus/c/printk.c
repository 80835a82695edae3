// Prints call arguments with bpf_printk (trace_printk with a stack format string).
#include "tool.h"

SEC("uprobe")
int BPF_KPROBE(print_args, u64 a, u64 b)
{
	if (a > b)
		bpf_printk("a=%llu > b=%llu", a, b);
	else
		bpf_printk("a=%llu", a);
	return 0;
}
