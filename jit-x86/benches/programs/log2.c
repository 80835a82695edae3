/* Integer log2 by bit-twiddling (a branch-free binary search over the bit position), summed
 * over the context's array of 64-bit values: the arithmetic a histogram probe does on every
 * event. */
#include "bench.h"

struct log2_ctx {
	u64 count;
	u64 values[];
};

static inline __attribute__((always_inline)) u64 log2_u64(u64 v)
{
	u64 r = 0, shift;

	shift = (v > 0xffffffffULL) << 5;
	v >>= shift;
	r |= shift;
	shift = (v > 0xffff) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xff) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xf) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	return r | (v >> 1);
}

BENCH_ENTRY u64 bench_run(struct log2_ctx *ctx)
{
	u64 n = ctx->count;
	u64 sum = 0;

	for (u64 i = 0; i < n; i++)
		sum += log2_u64(ctx->values[i]);
	return sum;
}
