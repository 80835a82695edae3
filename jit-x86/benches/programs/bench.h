/* Shared by the engine benchmark's programs. Each program is built twice from one source:
 * for eBPF (clang-19 -target bpf -mcpu=v2 -O2) and for the host (clang-19 -O2, the native
 * baseline). It takes one argument, a pointer to its context memory, which the bench fills,
 * and keeps everything it needs there: no helpers, no maps, no global data, so every engine
 * runs exactly the same bytecode. Sizes come from the context rather than constants so that
 * the native build cannot fold the work away. */
#ifndef BENCH_H
#define BENCH_H

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long s64;

#if defined(__bpf__)
/* The bench looks for the program in this section. */
#define BENCH_ENTRY __attribute__((section("bench"), used))
#else
#define BENCH_ENTRY __attribute__((visibility("default")))
#endif

#endif
