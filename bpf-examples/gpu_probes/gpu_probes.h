/* SPDX-License-Identifier: MIT */
#ifndef GPU_PROBES_H
#define GPU_PROBES_H

/* Slots of the `counts` array map. */
enum gpu_probes_slot {
	SLOT_ENTRIES,	/* GPU threads that entered vectorAdd */
	SLOT_EXITS,	/* GPU threads that left it */
	SLOT_ELEMENTS,	/* sum of `n` over the entering threads */
	SLOT_LAUNCHES,	/* launches, counted on the CPU */
	GPU_PROBES_SLOTS,
};

#endif
