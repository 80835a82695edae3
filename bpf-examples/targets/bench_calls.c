// SPDX-License-Identifier: MIT
/*
 * bench_calls N: times N calls of work() and prints the median cost of one call
 * over 11 rounds, for measuring what a probe on work() adds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, used)) int work(int x)
{
	volatile int v = x;
	return v + 1;
}

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
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
