// SPDX-License-Identifier: MIT
/*
 * bench_calls N: times N calls of work() and prints the median cost of one call
 * over 11 rounds, for measuring what a probe on work() adds.
 *
 * bench_calls --windows MS: prints "work=<address of work>", then calls work()
 * without end and, after each window of MS milliseconds, prints
 * "window start_ns=<CLOCK_MONOTONIC at its start> ns_per_call=<mean>
 * wall_ns_per_call=<mean>", so one process can be measured before, while and
 * after a tool is attached. ns_per_call counts this thread's CPU time only, so
 * time spent descheduled on a busy machine stays out of it. Exits 0 at end of
 * input on stdin.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline, used)) int work(int x)
{
	volatile int v = x;
	return v + 1;
}

static double clock_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static double now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Whether stdin is at end of input; never blocks. Other input is discarded. */
static int input_ended(void)
{
	struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
	char buf[256];

	if (poll(&p, 1, 0) <= 0)
		return 0;
	return read(STDIN_FILENO, buf, sizeof(buf)) <= 0;
}

static int windows(long ms)
{
	/* Reading the clock once per batch keeps its cost out of the figure. */
	const long batch = 1000;
	volatile long sink = 0;

	printf("work=%p\n", (void *)work);
	fflush(stdout);
	while (!input_ended()) {
		double t0 = now_ns(), end = t0 + ms * 1e6, t;
		double cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
		long calls = 0;

		do {
			for (long k = 0; k < batch; k++)
				sink += work((int)k);
			calls += batch;
			t = now_ns();
		} while (t < end);
		printf("window start_ns=%.0f ns_per_call=%.3f wall_ns_per_call=%.3f\n", t0,
		       (clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0) / calls,
		       (t - t0) / calls);
		fflush(stdout);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--windows") == 0) {
		long ms = argc > 2 ? strtol(argv[2], NULL, 10) : 0;

		if (ms <= 0) {
			fprintf(stderr, "usage: bench_calls --windows MS (MS > 0)\n");
			return 2;
		}
		return windows(ms);
	}

	long n = argc > 1 ? strtol(argv[1], NULL, 10) : 1000000;
	double rounds[11];
	volatile long sink = 0;

	for (int r = 0; r < 11; r++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++)
			sink += work((int)i);
		rounds[r] = (now_ns() - t0) / n;
	}
	qsort(rounds, 11, sizeof(rounds[0]), cmp);
	printf("ns_per_call=%.2f\n", rounds[5]);
	return 0;
}
