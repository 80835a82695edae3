/* Shared by the corpus's tool-like programs: the headers a libbpf tool uses. */
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s16 s16;
typedef __s32 s32;
typedef __s64 s64;

char LICENSE[] SEC("license") = "GPL";
