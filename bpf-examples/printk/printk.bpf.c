// SPDX-License-Identifier: MIT OR GPL-2.0-only
/*
 * printk: debug output with bpf_printk, read from the trace pipe.
 * See printk.h for the lines each call produces.
 */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "printk.h"

/* The loader attaches where --target/--func say; the section is for
 * `bpftime run`, which attaches where the section names. */
SEC("uprobe/work")
int BPF_KPROBE(on_call, int arg)
{
	bpf_printk("call arg=%d", arg);
	/* More than three arguments: libbpf's bpf_printk uses bpf_trace_vprintk. */
	bpf_printk("four %d %d %d %d\n", arg, arg + 1, arg + 2, arg + 3);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
