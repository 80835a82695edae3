/* Copies `words` 8-byte words from the first half of the context's data to the second,
 * one word at a time, as an eBPF program copying a record would. */
#include "bench.h"

struct memcpy_ctx {
	u64 words;
	u64 data[];
};

BENCH_ENTRY u64 bench_run(struct memcpy_ctx *ctx)
{
	u64 words = ctx->words;
	u64 *src = ctx->data;
	u64 *dst = ctx->data + words;

	for (u64 i = 0; i < words; i++)
		dst[i] = src[i];
	return dst[0] ^ dst[words / 2] ^ dst[words - 1];
}
