/* SPDX-License-Identifier: MIT */
#ifndef USDT_COUNT_H
#define USDT_COUNT_H

/* Slots of the `counts` array. */
enum usdt_slot {
	SLOT_TICKS,     /* bpftime_test:tick hits */
	SLOT_TICK_SUM,  /* sum of tick's second argument */
	SLOT_GUARDED,   /* bpftime_test:guarded hits */
	SLOT_GUARD_SUM, /* sum of guarded's argument */
	SLOT_NOP,       /* uprobe at loop_sum+2, a one-byte nop */
	SLOT_HEAD,      /* uprobe at loop_sum+3, the loop head */
	SLOT_HEAD_SUM,  /* sum of rdi at the loop head */
	SLOT_COUNT,
};

#endif
