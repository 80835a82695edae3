/* SPDX-License-Identifier: MIT */
/* Types shared by stacks.bpf.c (kernel side) and stacks.c. */
#ifndef STACKS_H
#define STACKS_H

/* Frames kept per trace: the probed function and three callers. */
#define STACK_FRAMES 4

/* What a result in `results` counts. */
enum {
	WHAT_STACKID = 0,         /* bpf_get_stackid, 64-entry map */
	WHAT_STACKID_SKIP1 = 1,   /* the same, skipping the first frame */
	WHAT_TINY = 2,            /* 1-entry map: a second trace collides */
	WHAT_TINY_REUSE = 3,      /* 1-entry map with BPF_F_REUSE_STACKID */
	WHAT_PAIR_REUSE = 4,      /* 2-entry map with BPF_F_REUSE_STACKID */
	WHAT_KERNEL_STACKID = 5,  /* bpf_get_stackid without BPF_F_USER_STACK */
	WHAT_BAD_FLAGS = 6,       /* bpf_get_stackid with an unknown flag */
	WHAT_KERNEL_STACK = 7,    /* bpf_get_stack without BPF_F_USER_STACK */
	WHAT_ODD_SIZE = 8,        /* bpf_get_stack into 12 bytes */
	WHAT_OUTER_RETURN = 9,    /* returns of the --outer functions */
	WHAT_COUNT = 10,
};

struct result_key {
	__u32 what;
	__s32 ret;
};

/* One per probe hit, in the ring buffer. */
struct stack_event {
	__u32 at_return;   /* 0: uprobe at entry, 1: uretprobe */
	__u32 arg;         /* first argument of the probed call (entry only) */
	__s64 len;         /* bpf_get_stack's return value */
	__u64 frames[STACK_FRAMES];
	__s64 len_skip1;   /* the same with one frame skipped, into 3 slots */
	__u64 frames_skip1[STACK_FRAMES - 1];
};

#endif /* STACKS_H */
