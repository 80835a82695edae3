// SPDX-License-Identifier: MIT
/*
 * bench_syscalls N: times N getppid() calls through the C library and prints the
 * median cost of one call over 11 rounds ("ns_per_call=<median> min=<fastest round>"),
 * for measuring what a syscall tracepoint adds to each call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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
	long n = argc > 1 ? atol(argv[1]) : 1000000;
	double per[11];

	if (n <= 0) {
		fprintf(stderr, "usage: %s N\n", argv[0]);
		return 2;
	}
	/* A warm-up round: the first calls of a site may be slower under bpftime (a site
	 * is rewritten after its first call). */
	for (long i = 0; i < n / 10 + 1000; i++)
		getppid();
	for (int r = 0; r < 11; r++) {
		double t0 = now_ns();
		for (long i = 0; i < n; i++)
			getppid();
		per[r] = (now_ns() - t0) / n;
	}
	qsort(per, 11, sizeof(per[0]), cmp);
	printf("ns_per_call=%.2f min=%.2f\n", per[5], per[0]);
	return 0;
}
