// SPDX-License-Identifier: MIT
/*
 * memtrace: where CUDA kernels read and write global memory, and when. A memory-access
 * probe (SEC("cuda:KERNEL:ldst"), here every kernel) runs in the GPU thread making each
 * global load, store, atomic and reduction (../common/gpu_access.h).
 *
 *   bpftime run --out DIR memtrace.bpf.o -- APP [ARGS]
 *
 * Aggregated on the GPU, exact:
 *   accesses            loads, stores, atomics and reductions per kernel: entry
 *                       KERNEL_SLOTS * kind + slot, the kernel's slot its kernel_id
 *                       modulo KERNEL_SLOTS; `kernels` names the kernel in each slot
 *                       (filled at launch, on the CPU), and `collisions` counts launches
 *                       of a kernel whose slot another kernel holds (their counts merge)
 *   offset_hist_argN    a log2 histogram of each access's offset from the kernel's
 *                       pointer argument N its address is computed from (the buffer it
 *                       is in, for a kernel handed its buffers as arguments; where the
 *                       code does not say, the argument it falls after), in bytes
 * Sampled (the first lane's access to one 128-byte line in 256, about one access in 8192):
 *   timeline            records of when (bpf_ktime_get_ns, the host's clock) and where;
 *                       `bpftime run --out DIR` draws them as DIR/timeline.png
 *
 * Every map the GPU side updates is an array small enough for bpftime to keep a copy per
 * SM and add warps' updates up before they reach memory: a hash map updated by every
 * access would serialize them.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include "../common/gpu_access.h"
#include "../common/cuda_launch.h"

#define SLOTS 64

#define KERNEL_SLOTS 128
#define KINDS 4

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, KERNEL_SLOTS * KINDS);
	__type(key, __u32);
	__type(value, __u64);
} accesses SEC(".maps");

struct kernel_name {
	__u32 kernel_id;
	char name[BPFTIME_LAUNCH_NAME_BYTES];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, KERNEL_SLOTS);
	__type(key, __u32);
	__type(value, struct kernel_name);
} kernels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} collisions SEC(".maps");

#define OFFSET_HIST(n)                                                                   \
	struct {                                                                         \
		__uint(type, BPF_MAP_TYPE_ARRAY);                                        \
		__uint(max_entries, SLOTS);                                              \
		__type(key, __u32);                                                      \
		__type(value, __u64);                                                    \
	} offset_hist_arg##n SEC(".maps")

OFFSET_HIST(0);
OFFSET_HIST(1);
OFFSET_HIST(2);
OFFSET_HIST(3);
OFFSET_HIST(4);
OFFSET_HIST(5);

struct access_sample {
	__u64 time_ns;
	__u64 addr;
	__u32 kernel_id;
	__u32 kind;
	__u32 site;
	__u16 size;
	/* The kernel's pointer argument the access falls in (0-5), 6 for none: the
	 * timeline names its buffers by it. */
	__u16 arg;
};
/* 32 bytes: with a record of 40 the instrumented vectorAdd kept 128 bytes in local
 * memory instead of 32 (H100, 2026-12-07). */
_Static_assert(sizeof(struct access_sample) == 32, "one 32-byte record");

/* Puts the record's type in the object's BTF, so tools read records field by field. */
const struct access_sample *access_sample_type __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24);
} timeline SEC(".maps");

/* floor(log2(v)), 0 for 0. clang finds the count of leading zeros in this loop, and
 * writes it without a loop in eBPF (which has no such instruction); bpftime's GPU
 * compiler turns that back into the GPU's one `clz`. */
static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;

	while (v >>= 1)
		r++;
	return r;
}

/* The kernel's parameter `i` (0 to 5) from the context. Each is read at its own offset
 * and made opaque to clang first: one read at an offset picked at run time would be a
 * context access the verifier refuses (libbpf's barrier_var). */
#define opaque(v) asm volatile("" : "+r"(v))

static __always_inline __u64 param(const __u64 *regs, __u32 i)
{
	__u64 p0 = regs[14], p1 = regs[13], p2 = regs[12], p3 = regs[11], p4 = regs[9],
	      p5 = regs[8];

	opaque(p0);
	opaque(p1);
	opaque(p2);
	opaque(p3);
	opaque(p4);
	opaque(p5);
	return i == 0 ? p0 : i == 1 ? p1 : i == 2 ? p2 : i == 3 ? p3 : i == 4 ? p4 : p5;
}

static __always_inline void count(void *hist, __u32 slot)
{
	__u64 *n = bpf_map_lookup_elem(hist, &slot);

	if (n)
		__sync_fetch_and_add(n, 1);
}

SEC("cuda:*:ldst")
int memtrace_access(void *ctx)
{
	const struct bpftime_gpu_access *a = bpftime_gpu_access(ctx);
	const __u64 *regs = ctx;
	__u64 addr = a->addr, offset = ~0ULL;
	__u32 arg = 6;

	__u32 kind = a->kind - 1;

	if (kind < KINDS)
		count(&accesses, KERNEL_SLOTS * kind + a->kernel_id % KERNEL_SLOTS);

	/* The pointer argument the address is computed from, as bpftime found it in the
	 * kernel's code (a constant for each access); else the one it is after, nearest
	 * first. pt_regs' di, si, dx, cx, r8 and r9 hold the kernel's first six
	 * parameters. An address below an argument wraps around to a distance no buffer
	 * has. */
	if (a->arg >= 0 && a->arg < 6) {
		arg = a->arg;
		offset = addr - param(regs, arg);
	} else {
#define NEAREST(i, reg)                                                                  \
	if (addr - regs[reg] < offset) {                                                 \
		offset = addr - regs[reg];                                               \
		arg = i;                                                                 \
	}
		NEAREST(0, 14)
		NEAREST(1, 13)
		NEAREST(2, 12)
		NEAREST(3, 11)
		NEAREST(4, 9)
		NEAREST(5, 8)
	}
	__u32 slot = log2_slot(offset);

	switch (arg) {
	case 0: count(&offset_hist_arg0, slot); break;
	case 1: count(&offset_hist_arg1, slot); break;
	case 2: count(&offset_hist_arg2, slot); break;
	case 3: count(&offset_hist_arg3, slot); break;
	case 4: count(&offset_hist_arg4, slot); break;
	case 5: count(&offset_hist_arg5, slot); break;
	}

	/* One 128-byte line in 256, picked by a hash of its address: each picked line
	 * shows every access to it, the same lines in every launch, and no random
	 * number costs every access. The hash is of the line number's low 32 bits, a
	 * multiply a GPU does in one instruction. */
	if ((addr & 127) == 0 && ((__u32)(addr >> 7) * 0x9E3779B1U) >> 24 == 0) {
		struct access_sample s = {
			.time_ns = bpf_ktime_get_ns(),
			.addr = addr,
			.kernel_id = a->kernel_id,
			.kind = a->kind,
			.size = a->size,
			.site = a->site,
			.arg = arg,
		};

		bpf_ringbuf_output(&timeline, &s, sizeof(s), 0);
	}
	return 0;
}

SEC("cuda:*:launch")
int memtrace_launch(struct bpftime_cuda_launch *ctx)
{
	struct kernel_name k = { .kernel_id = ctx->kernel_id };
	__u32 slot = ctx->kernel_id % KERNEL_SLOTS, zero = 0;
	struct kernel_name *held;

	if (ctx->phase != BPFTIME_LAUNCH_CALLED)
		return 0;
	held = bpf_map_lookup_elem(&kernels, &slot);
	if (held) {
		if (held->kernel_id != ctx->kernel_id) {
			__u64 *n = bpf_map_lookup_elem(&collisions, &zero);

			if (n)
				__sync_fetch_and_add(n, 1);
		}
		return 0;
	}
	bpf_probe_read_kernel(k.name, sizeof(k.name), ctx->name);
	bpf_map_update_elem(&kernels, &slot, &k, BPF_NOEXIST);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
