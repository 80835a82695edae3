// USDT and mid-function probe target.
//
// Usage: usdt_target N   calls step(0..N), prints "total=<sum> guarded=<semaphore seen>"
//        usdt_target -   prints "loop_sum=<address>", then for each line "N" read on stdin
//                        makes N more calls (i going on from the last batch) and prints the
//                        same line, counted from the start; exits 0 at end of input
//
// step() fires two USDT probes (bpftime_test:tick always, bpftime_test:guarded only while
// its semaphore is raised, which <sys/sdt.h> code tests before preparing arguments; both
// have one, as `_SDT_HAS_SEMAPHORES` gives every probe of a file one) and calls
// loop_sum(i % 7 + 1), a hand-written loop whose one-byte `nop` at loop_sum+2 sits right
// before the loop head at loop_sum+3: a 5-byte jump there would overwrite the loop head, so
// a probe at +2 needs a breakpoint, while one at +3 (the head itself) can take the jump.
// It prints how many times it saw the semaphore raised, so a test can check that tools
// raise it exactly while attached.
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

__extension__ unsigned short bpftime_test_tick_semaphore __attribute__((unused))
__attribute__((section(".probes")));
__extension__ unsigned short bpftime_test_guarded_semaphore __attribute__((unused))
__attribute__((section(".probes")));

long loop_sum(long n);
__asm__(".text\n"
        ".globl loop_sum\n"
        ".type loop_sum, @function\n"
        "loop_sum:\n"
        "  xor %eax, %eax\n"      // +0, 2 bytes
        "  nop\n"                 // +2, 1 byte: the one-byte probe site
        "1: add %rdi, %rax\n"     // +3, the loop head
        "  dec %rdi\n"
        "  jnz 1b\n"
        "  ret\n"
        ".size loop_sum, .-loop_sum\n");

static long guarded_seen;

__attribute__((noinline)) long step(long i)
{
    long j = i * 3;
    STAP_PROBE2(bpftime_test, tick, i, j);
    if (__builtin_expect(bpftime_test_guarded_semaphore, 0)) {
        guarded_seen++;
        STAP_PROBE1(bpftime_test, guarded, i);
    }
    return loop_sum(i % 7 + 1);
}

int main(int argc, char **argv)
{
    long total = 0, i = 0;
    if (argc > 1 && argv[1][0] == '-') {
        char line[64];
        printf("loop_sum=%p\n", (void *)loop_sum);
        fflush(stdout);
        while (fgets(line, sizeof(line), stdin)) {
            for (long end = i + atol(line); i < end; i++)
                total += step(i);
            printf("total=%ld guarded=%ld\n", total, guarded_seen);
            fflush(stdout);
        }
        return 0;
    }
    long n = argc > 1 ? atol(argv[1]) : 100;
    for (; i < n; i++)
        total += step(i);
    printf("total=%ld guarded=%ld\n", total, guarded_seen);
    return 0;
}
