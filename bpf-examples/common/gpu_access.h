/* SPDX-License-Identifier: MIT */
/*
 * The context of a memory-access probe, SEC("cuda:KERNEL:ldst") (or bpftime's
 * SEC("kprobe/__memcapture") on a program named cuda__*, for every kernel): a GPU program
 * that bpftime runs in the thread making each global load, store, atomic and reduction of
 * the kernels KERNEL names, just before the access. SEC("cuda:KERNEL:ldst.shared") runs
 * at all of those and at every shared-memory access too (`__shared__` arrays).
 *
 * The context is a struct pt_regs, as for entry and exit probes: PT_REGS_PARM1(ctx) ..
 * PT_REGS_PARM6(ctx) are the kernel's first six parameters. The access itself sits in the
 * slots no parameter uses; bpftime_gpu_access(ctx) reads it:
 *
 *   addr       the generic address accessed (what cudaMalloc returned, plus the offset;
 *              for shared memory the generic address of the byte in the block's window, so
 *              two __shared__ arrays are told apart by where they fall, and a block's
 *              array is at the same address in every block)
 *   value      the first 8 bytes written by a store, atomic or reduction (0 for a load),
 *   value_hi   and the next 8 (vector stores of 16 bytes), each lane zero-extended
 *   size       bytes accessed: 4 for ld.global.f32, 16 for ld.global.v4.f32
 *   kind       BPFTIME_GPU_LOAD, _STORE, _ATOMIC (atom: reads and writes) or _REDUCTION (red)
 *   space      BPFTIME_GPU_GLOBAL or BPFTIME_GPU_SHARED (always GLOBAL for :ldst probes)
 *   kernel_id  FNV-1a of the kernel's mangled name, as struct bpftime_cuda_launch carries it
 *   site       the access's index among the kernel's accesses this kind of probe sees
 *              (global ones for :ldst, global and shared ones for :ldst.shared), in PTX order
 *   arg        the kernel parameter (0 for the first) the address is computed from, the
 *              buffer the access is in for a kernel handed its buffers: bpftime follows the
 *              address register back through moves, conversions and added offsets to one
 *              pointer parameter; BPFTIME_GPU_NO_ARG (-1) when it leads to none or to
 *              several (a pointer read from memory, a shared-memory address). A constant
 *              for each access, so a probe that branches on it costs nothing there.
 *
 * Accesses through generic addresses count when the address is a global one (or, for
 * :ldst.shared, a shared one of the thread's own block). Local, constant and parameter
 * memory are left out.
 *
 * kind and space share what was once a 32-bit kind, space in the high half: a tool built
 * against the 32-bit kind reads the same values as ever from :ldst probes, whose space is
 * always 0.
 */
#ifndef BPFTIME_GPU_ACCESS_H
#define BPFTIME_GPU_ACCESS_H

#include <linux/types.h>

#define BPFTIME_GPU_LOAD 1
#define BPFTIME_GPU_STORE 2
#define BPFTIME_GPU_ATOMIC 3
#define BPFTIME_GPU_REDUCTION 4

#define BPFTIME_GPU_GLOBAL 0
#define BPFTIME_GPU_SHARED 1

#define BPFTIME_GPU_NO_ARG (-1)

/* The first 48 bytes of the context: pt_regs' r15, r14, r13, r12, bp and bx slots. */
struct bpftime_gpu_access {
	__u64 addr;
	__u64 value;
	__u64 value_hi;
	__u32 size;
	__u16 kind;
	__u16 space;
	__u32 kernel_id;
	__u32 site;
	__s32 arg;
	__u32 reserved;
};

static __always_inline const struct bpftime_gpu_access *bpftime_gpu_access(const void *ctx)
{
	return (const struct bpftime_gpu_access *)ctx;
}

#endif
