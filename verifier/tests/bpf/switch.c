#include "common.h"

MAP(counts, BPF_MAP_TYPE_ARRAY, 4, 8, 32);
MAP(rb, BPF_MAP_TYPE_RINGBUF, 0, 0, 4096);

struct rec {
	__u64 a, b;
	__u32 kind;
	__u32 pad;
};

static __always_inline __u32 classify(__u64 x)
{
	switch (x & 7) {
	case 0: return 3;
	case 1: return 9;
	case 2: return 17;
	case 3: return x > 100 ? 30 : 2;
	case 4: return 5;
	default: return 31;
	}
}

SEC("uprobe")
int sw(struct pt_regs *ctx)
{
	__u64 x = PT_REGS_PARM1(ctx), y = PT_REGS_PARM2(ctx);
	__u32 k = classify(x);
	__u64 *c = bpf_map_lookup_elem(&counts, &k);
	if (c)
		*c += y;
	for (int i = 0; i < 4; i++) {
		struct rec *r = bpf_ringbuf_reserve(&rb, sizeof(*r), 0);
		if (!r)
			break;
		r->a = x + i;
		r->b = y;
		r->kind = k;
		if (y & (1 << i))
			bpf_ringbuf_discard(r, 0);
		else
			bpf_ringbuf_submit(r, 0);
	}
	return 0;
}
