/* Compares pairs of NUL-terminated strings held in the context, byte by byte, as a probe
 * filtering on a path or a command name does. Pair k is at text + 2k * stride and
 * text + (2k + 1) * stride. */
#include "bench.h"

struct strcmp_ctx {
	u64 pairs;
	u64 stride;
	u8 text[];
};

static inline __attribute__((always_inline)) s64 compare(const u8 *a, const u8 *b)
{
	while (*a && *a == *b) {
		a++;
		b++;
	}
	return (s64)*a - (s64)*b;
}

BENCH_ENTRY u64 bench_run(struct strcmp_ctx *ctx)
{
	u64 pairs = ctx->pairs;
	u64 stride = ctx->stride;
	u64 equal = 0;
	s64 order = 0;

	for (u64 k = 0; k < pairs; k++) {
		s64 c = compare(ctx->text + 2 * k * stride, ctx->text + (2 * k + 1) * stride);
		equal += c == 0;
		order += c;
	}
	return (equal << 32) ^ (u64)order;
}
