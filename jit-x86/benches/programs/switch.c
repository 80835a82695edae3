/* A dense 16-way switch in a loop, dispatching on bits of a pseudo-random sequence: the shape
 * of an interpreter or a protocol parser. Every case does something different, so the
 * compiler cannot turn the switch into a lookup table. */
#include "bench.h"

struct switch_ctx {
	u64 iterations;
	u64 seed;
};

BENCH_ENTRY u64 bench_run(struct switch_ctx *ctx)
{
	u64 n = ctx->iterations;
	u64 x = ctx->seed;
	u64 acc = 0;

	for (u64 i = 0; i < n; i++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		switch ((x >> 33) & 15) {
		case 0: acc += x; break;
		case 1: acc ^= x >> 7; break;
		case 2: acc -= x; break;
		case 3: acc = acc * 3 + 1; break;
		case 4: acc = (acc << 5) | (acc >> 59); break;
		case 5: acc += i; break;
		case 6: acc ^= 0x5bd1e995; break;
		case 7: acc = ~acc; break;
		case 8: acc += x >> 40; break;
		case 9: acc -= i * 7; break;
		case 10: acc |= x & 0xff; break;
		case 11: acc &= x | 0xffff0000ULL; break;
		case 12: acc = acc * 31 + (x & 0xffff); break;
		case 13: acc ^= acc >> 13; break;
		case 14: acc += (x & 0xf) << 20; break;
		default: acc -= acc >> 3; break;
		}
	}
	return acc;
}
