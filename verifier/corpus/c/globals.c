// Global variables: a .bss counter, a .data setting and a .rodata table indexed by a masked value.
#include "tool.h"

u64 hits;
u32 sample_every = 4;
const volatile u32 enabled = 1;
static const u8 weights[16] = { 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 121, 98, 219, 61 };
u64 weighted;

SEC("uprobe")
int BPF_KPROBE(weigh, u64 x)
{
	if (!enabled)
		return 0;
	hits++;
	if (sample_every && hits % sample_every)
		return 0;
	weighted += weights[x & 15];
	return 0;
}
