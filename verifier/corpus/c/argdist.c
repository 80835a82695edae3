// Linear buckets of the first argument's value, per CPU; out-of-range values counted apart.
#include "tool.h"

#define BUCKETS 64
#define WIDTH 16

struct dist {
	u64 buckets[BUCKETS];
	u64 over;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 64);
	__type(key, u32);
	__type(value, struct dist);
} dists SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct dist);
} scratch SEC(".maps");

SEC("uprobe")
int BPF_KPROBE(arg_dist, s64 value)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32, zero = 0;
	struct dist *d = bpf_map_lookup_elem(&dists, &tgid);
	u64 b;

	if (!d) {
		struct dist *init = bpf_map_lookup_elem(&scratch, &zero);
		if (!init)
			return 0;
		bpf_map_update_elem(&dists, &tgid, init, BPF_NOEXIST);
		d = bpf_map_lookup_elem(&dists, &tgid);
		if (!d)
			return 0;
	}
	if (value < 0) {
		d->over++;
		return 0;
	}
	b = value / WIDTH;
	if (b >= BUCKETS) {
		d->over++;
		return 0;
	}
	d->buckets[b]++;
	return 0;
}
