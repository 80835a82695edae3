/* Sieve of Eratosthenes over the context's byte array: counts the primes below `limit`.
 * Each entry is cleared once it has been read, so the array is all zero again at the end
 * and the next run needs no clearing pass (which clang would turn into a `memset` call,
 * something eBPF cannot make). */
#include "bench.h"

struct prime_ctx {
	u64 limit;
	u8 composite[];
};

BENCH_ENTRY u64 bench_run(struct prime_ctx *ctx)
{
	u64 limit = ctx->limit;
	u64 count = 0;

	for (u64 i = 2; i < limit; i++) {
		if (ctx->composite[i]) {
			ctx->composite[i] = 0;
			continue;
		}
		count++;
		for (u64 j = i * i; j < limit; j += i)
			ctx->composite[j] = 1;
	}
	return count;
}
