/* SPDX-License-Identifier: MIT */
/* Types shared by malloc_count.bpf.c (kernel side) and malloc_count.c. */
#ifndef MALLOC_COUNT_H
#define MALLOC_COUNT_H

/* Value of the `per_pid` hash and of the single `totals` array slot. */
struct malloc_stats {
	__u64 calls; /* number of malloc() calls */
	__u64 bytes; /* sum of the sizes passed to malloc() */
};

/* Key of the `per_size` hash: how often a process asked for one size. */
struct size_key {
	__u32 tgid;
	__u32 pad; /* keep the key free of compiler padding */
	__u64 size;
};

#endif /* MALLOC_COUNT_H */
