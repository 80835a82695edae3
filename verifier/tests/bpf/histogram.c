#include "common.h"

MAP(hist, BPF_MAP_TYPE_ARRAY, 4, 8, 64);
MAP(seen, BPF_MAP_TYPE_PERCPU_ARRAY, 4, 64, 1);

SEC("uretprobe")
int log2_hist(struct pt_regs *ctx)
{
	__u64 v = PT_REGS_RC(ctx);
	__u32 slot = 0;
	for (int i = 0; i < 63 && v > 1; i++) {
		v >>= 1;
		slot++;
	}
	__u64 *cnt = bpf_map_lookup_elem(&hist, &slot);
	if (cnt)
		__sync_fetch_and_add(cnt, 1);

	/* A variable index into a map value, bounded by a mask. */
	__u32 zero = 0;
	__u8 *buf = bpf_map_lookup_elem(&seen, &zero);
	if (buf)
		buf[PT_REGS_PARM1(ctx) & 63] += 1;
	return 0;
}
