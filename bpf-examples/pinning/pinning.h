/* SPDX-License-Identifier: MIT */
#ifndef PINNING_H
#define PINNING_H
/* Slots of the pinned `counts` array. */
#define PINNING_SLOTS 4
#endif
