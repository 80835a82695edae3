// SPDX-License-Identifier: MIT
/*
 * calls: a deterministic target for the examples and their tests.
 *
 * Usage: calls N [--wait-for FILE] [--delay-ms MS] [--threads T] [--exit-at I]
 *
 * Calls work(i) for i = 0 .. N-1 and, in the same loop, malloc(CALLS_MALLOC_SIZE)
 * N times (each block is touched and freed), then exits 0. Nothing is printed.
 *
 *   --threads T      do that on T threads at once (T x N calls in all), all
 *                    starting together
 *   --wait-for FILE  do not start until FILE exists (polled every 10 ms),
 *                    so a tracer can be attached first
 *   --delay-ms MS    sleep MS milliseconds before starting
 *   --exit-at I      work(I) calls exit(0) instead of returning: a process
 *                    that ends inside a probed function
 *
 * CALLS_MALLOC_SIZE is an odd size that libc itself never asks for, so a
 * tracer can count exactly N mallocs of that size for this process.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CALLS_MALLOC_SIZE 7919

/*
 * The function the examples probe. It must stay a real, separate, exported
 * function: noinline keeps the calls to it, and for GCC noipa also stops
 * cloning (work.constprop.0) and other interprocedural tricks that would
 * move the calls away from the symbol "work". The volatile scratch array
 * keeps the body a few dozen bytes long, like a real function, so that
 * runtimes which patch a jump over a function's first bytes have room.
 */
#if defined(__GNUC__) && !defined(__clang__)
#define NOT_OPTIMIZED_AWAY __attribute__((noinline, noipa, used))
#else
#define NOT_OPTIMIZED_AWAY __attribute__((noinline, used))
#endif

static volatile long exit_at = -1;

NOT_OPTIMIZED_AWAY int work(int x)
{
	volatile int scratch[4];
	int i, sum = 0;

	if (x == exit_at)
		exit(0);
	for (i = 0; i < 4; i++)
		scratch[i] = x + i;
	for (i = 0; i < 4; i++)
		sum += scratch[i];
	return sum; /* 4 * x + 6 */
}

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

static int usage(void)
{
	fprintf(stderr,
		"Usage: calls N [--wait-for FILE] [--delay-ms MS] [--threads T] [--exit-at I]\n");
	return 2;
}

static long calls_per_thread;
static pthread_barrier_t start_together;

/* The calls of one thread: 0 on success. */
static int run_calls(long n)
{
	volatile long sink = 0;
	long i;

	for (i = 0; i < n; i++) {
		char *block;

		sink += work((int)i);

		block = malloc(CALLS_MALLOC_SIZE);
		if (!block) {
			fprintf(stderr, "calls: out of memory\n");
			return 1;
		}
		/* Use the block, so the malloc/free pair cannot be elided. */
		block[i % CALLS_MALLOC_SIZE] = (char)i;
		__asm__ volatile("" : : "r"(block) : "memory");
		free(block);
	}
	return 0;
}

static void *thread_main(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&start_together);
	return (void *)(long)run_calls(calls_per_thread);
}

int main(int argc, char **argv)
{
	const char *wait_for = NULL;
	long delay_ms = 0, n = -1, threads = 1;
	pthread_t tids[64];
	char *end;
	int i, failed = 0;

	for (i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--wait-for") == 0 && i + 1 < argc) {
			wait_for = argv[++i];
		} else if (strcmp(argv[i], "--delay-ms") == 0 && i + 1 < argc) {
			delay_ms = strtol(argv[++i], &end, 10);
			if (*end || delay_ms < 0)
				return usage();
		} else if (strcmp(argv[i], "--exit-at") == 0 && i + 1 < argc) {
			exit_at = strtol(argv[++i], &end, 10);
			if (*end || exit_at < 0)
				return usage();
		} else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
			threads = strtol(argv[++i], &end, 10);
			if (*end || threads < 1 || threads > 64)
				return usage();
		} else if (n < 0) {
			n = strtol(argv[i], &end, 10);
			if (*end || n < 0 || n > 0x7fffffff)
				return usage();
		} else {
			return usage();
		}
	}
	if (n < 0)
		return usage();

	while (wait_for && access(wait_for, F_OK) != 0)
		sleep_ms(10);
	if (delay_ms)
		sleep_ms(delay_ms);

	if (threads == 1)
		return run_calls(n);
	calls_per_thread = n;
	pthread_barrier_init(&start_together, NULL, (unsigned)threads);
	for (i = 0; i < threads; i++) {
		if (pthread_create(&tids[i], NULL, thread_main, NULL)) {
			fprintf(stderr, "calls: cannot start thread %d\n", i);
			return 1;
		}
	}
	for (i = 0; i < threads; i++) {
		void *r;

		pthread_join(tids[i], &r);
		failed |= r != NULL;
	}
	return failed;
}
