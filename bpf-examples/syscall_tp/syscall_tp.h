/* SPDX-License-Identifier: MIT */
#ifndef SYSCALL_TP_H
#define SYSCALL_TP_H

#define FILENAME_LEN 128
/* Keys of the counts map past the system call numbers (which are below 1024). */
#define KEY_RAW_OPENAT_PREFIX 1000 /* raw sys_enter: openat of a --prefix path, through pt_regs */
#define KEY_EXIT_BASE 2000         /* raw sys_exit: 2000 + number */

/* One openat of the watched process, emitted at its return. */
struct open_event {
	__u32 tid;
	__s32 nr;   /* __syscall_nr as the entry record gave it */
	__s64 dfd;
	__s64 flags;
	__s64 mode;
	__s64 ret;
	char filename[FILENAME_LEN];
};

#endif
