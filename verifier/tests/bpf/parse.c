#include "common.h"

/* Parsing user memory with data-dependent loops and indices: the shapes that
 * need bounds from comparisons, masks and 32-bit subregisters. */

struct req {
	__u32 len;
	__u8 method;
	char path[48];
};

struct stat {
	__u64 by_method[8];
	__u64 by_len[16];
	__u64 slashes;
};

MAP(stats, BPF_MAP_TYPE_PERCPU_ARRAY, 4, sizeof(struct stat), 1);
MAP(paths, BPF_MAP_TYPE_LRU_HASH, 48, 8, 4096);

SEC("uprobe")
int parse(struct pt_regs *ctx)
{
	struct req r;
	__u32 zero = 0;

	if (bpf_probe_read_user(&r, sizeof(r), (void *)PT_REGS_PARM1(ctx)))
		return 0;
	struct stat *st = bpf_map_lookup_elem(&stats, &zero);
	if (!st)
		return 0;
	if (r.method < 8)
		st->by_method[r.method]++;
	__u32 bucket = r.len / 64;
	if (bucket > 15)
		bucket = 15;
	st->by_len[bucket]++;

	__u32 n = r.len;
	if (n > sizeof(r.path))
		n = sizeof(r.path);
	for (__u32 i = 0; i < n; i++) {
		if (r.path[i] == '/')
			st->slashes++;
	}
	r.path[sizeof(r.path) - 1] = 0;
	__u64 *cnt = bpf_map_lookup_elem(&paths, r.path);
	if (cnt) {
		__sync_fetch_and_add(cnt, 1);
	} else {
		__u64 one = 1;
		bpf_map_update_elem(&paths, r.path, &one, BPF_NOEXIST);
	}
	return 0;
}
