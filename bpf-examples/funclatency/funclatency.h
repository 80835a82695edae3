/* SPDX-License-Identifier: MIT */
/* Types shared by funclatency.bpf.c (kernel side) and funclatency.c. */
#ifndef FUNCLATENCY_H
#define FUNCLATENCY_H

/*
 * Slot i of the `hist` array counts calls that took between 2^i and
 * 2^(i+1) - 1 nanoseconds (slot 0 also holds 0 ns). 2^63 ns is ~292 years.
 */
#define HIST_SLOTS 64

/* Slots of the `stats` array. */
enum {
	STAT_COUNT = 0,    /* completed calls */
	STAT_TOTAL_NS = 1, /* sum of their durations */
	STAT_MISSED = 2,   /* returns seen without a matching entry */
	STAT_SLOTS = 3,
};

#endif /* FUNCLATENCY_H */
