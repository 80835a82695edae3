/* Shared by the test programs: map definitions the test harness reads back from
 * the "maps" section (five u32s each), so no BTF parsing is needed. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct map_def {
	unsigned int type, key_size, value_size, max_entries, flags;
};
#define MAP(name, t, k, v, n) struct map_def name SEC("maps") = { t, k, v, n, 0 }
