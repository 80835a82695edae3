#include "common.h"

MAP(stats, BPF_MAP_TYPE_ARRAY, 4, 16, 4);

struct acc {
	__u64 sum;
	__u64 n;
};

static __noinline __u64 mix(__u64 a, __u64 b)
{
	return (a * 31) ^ (b >> 3);
}

static __noinline int account(struct acc *acc, __u64 v)
{
	acc->sum += mix(v, acc->n);
	acc->n++;
	return acc->n > 100;
}

static long step(__u64 i, void *data)
{
	struct acc *acc = data;
	acc->sum += i;
	return acc->sum > 1000 ? 1 : 0;
}

SEC("uprobe")
int calls(struct pt_regs *ctx)
{
	struct acc acc = {};
	__u32 key = PT_REGS_PARM1(ctx) & 3;
	account(&acc, PT_REGS_PARM2(ctx));
	bpf_loop(16, step, &acc, 0);
	struct acc *out = bpf_map_lookup_elem(&stats, &key);
	if (out) {
		out->sum += acc.sum;
		out->n += acc.n;
	}
	bpf_printk("sum %llu n %llu", acc.sum, acc.n);
	return 0;
}
