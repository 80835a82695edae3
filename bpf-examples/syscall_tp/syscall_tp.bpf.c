// SPDX-License-Identifier: MIT
/*
 * syscall_tp: system call tracepoints of one process, chosen by its command name.
 *
 *  - tracepoint/syscalls/sys_enter_openat and sys_exit_openat: each openat with its
 *    arguments and result, into a ring buffer (the entry's record is kept per thread
 *    until the return, as opensnoop does);
 *  - raw_tracepoint/sys_enter: a count per system call number, and, for openat, the
 *    filename read through the pt_regs pointer (args[0]) to count those under a prefix;
 *  - raw_tracepoint/sys_exit: a count per number of the calls that returned, from
 *    pt_regs->orig_ax.
 *
 * The records are declared as the kernel's format files lay them out.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "syscall_tp.h"

char LICENSE[] SEC("license") = "GPL";

#define NR_OPENAT 257

const volatile char target_comm[16] = {};
const volatile char prefix[64] = {};
const volatile __u32 prefix_len = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 22);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct open_event);
} pending SEC(".maps");

/* events/syscalls/sys_enter_openat/format */
struct enter_openat {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__s64 dfd;
	const char *filename;
	__s64 flags;
	__s64 mode;
};

/* events/syscalls/sys_exit_openat/format */
struct exit_openat {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__s64 ret;
};

/* The registers as x86-64's struct pt_regs lays them out. */
struct regs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

static __always_inline int is_target(void)
{
	char comm[16];

	bpf_get_current_comm(comm, sizeof(comm));
	for (int i = 0; i < 16; i++) {
		if (comm[i] != target_comm[i])
			return 0;
		if (comm[i] == 0)
			break;
	}
	return 1;
}

static __always_inline void bump(__u32 key)
{
	__u64 zero = 0, *v = bpf_map_lookup_elem(&counts, &key);

	/* Threads on two CPUs may both find the key missing: one insert wins, the other
	 * fails (EEXIST), and both then add to the one value; inserting 1 instead lost a
	 * count now and then on the kernel (728 of 729). */
	if (!v) {
		bpf_map_update_elem(&counts, &key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&counts, &key);
	}
	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("tracepoint/syscalls/sys_enter_openat")
int enter_openat(struct enter_openat *ctx)
{
	struct open_event e = {};
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	if (!is_target())
		return 0;
	e.tid = tid;
	e.nr = ctx->nr;
	e.dfd = ctx->dfd;
	e.flags = ctx->flags;
	e.mode = ctx->mode;
	bpf_probe_read_user_str(e.filename, sizeof(e.filename), ctx->filename);
	bpf_map_update_elem(&pending, &tid, &e, BPF_ANY);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_openat")
int exit_openat(struct exit_openat *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct open_event *e = bpf_map_lookup_elem(&pending, &tid);

	if (!e)
		return 0;
	e->ret = ctx->ret;
	bpf_ringbuf_output(&events, e, sizeof(*e), 0);
	bpf_map_delete_elem(&pending, &tid);
	return 0;
}

SEC("raw_tracepoint/sys_enter")
int raw_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 nr = ctx->args[1];

	if (!is_target())
		return 0;
	bump(nr);
	if (nr == NR_OPENAT) {
		struct regs *regs = (struct regs *)ctx->args[0];
		const char *filename = 0;
		char buf[64] = {};

		bpf_probe_read_kernel(&filename, sizeof(filename), &regs->si);
		bpf_probe_read_user_str(buf, sizeof(buf), filename);
		for (int i = 0; i < 64; i++) {
			if (i >= prefix_len)
				break;
			if (buf[i] != prefix[i])
				return 0;
		}
		bump(KEY_RAW_OPENAT_PREFIX);
	}
	return 0;
}

SEC("raw_tracepoint/sys_exit")
int raw_exit(struct bpf_raw_tracepoint_args *ctx)
{
	struct regs *regs = (struct regs *)ctx->args[0];
	__u64 nr = 0;

	if (!is_target())
		return 0;
	bpf_probe_read_kernel(&nr, sizeof(nr), &regs->orig_ax);
	if (nr < 1000)
		bump(KEY_EXIT_BASE + nr);
	return 0;
}
