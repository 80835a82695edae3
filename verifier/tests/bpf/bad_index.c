#include "common.h"

/* Must be rejected: the index into the map value is only bounded below. */

MAP(hist, BPF_MAP_TYPE_ARRAY, 4, 128, 1);

SEC("uprobe")
int bad_index(struct pt_regs *ctx)
{
	__u32 zero = 0;
	__u64 *h = bpf_map_lookup_elem(&hist, &zero);
	if (!h)
		return 0;
	__u32 i = PT_REGS_PARM1(ctx) / 64;
	h[i]++;
	return 0;
}
