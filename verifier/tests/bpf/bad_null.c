#include "common.h"

/* Must be rejected: the lookup result is used on the path where it is NULL. */

MAP(counts, BPF_MAP_TYPE_HASH, 4, 8, 16);

SEC("uprobe")
int bad_null(struct pt_regs *ctx)
{
	__u32 k = PT_REGS_PARM1(ctx);
	__u64 *v = bpf_map_lookup_elem(&counts, &k);
	if (PT_REGS_PARM2(ctx) > 5 && v)
		return 1;
	*v += 1;
	return 0;
}
