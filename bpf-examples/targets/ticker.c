// SPDX-License-Identifier: MIT
/*
 * ticker: a target driven through stdin, so a test decides exactly which
 * calls happen before and after a tool attaches or detaches.
 *
 * Usage: ticker
 *
 * Prints "work=<address of work>" and then, for each line "N" read on stdin,
 * calls work(i) N times, i continuing from where the last batch stopped
 * (0, 1, 2, ...), and prints "done total=<calls so far>". Exits 0 at end of
 * input.
 */
#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#define NOT_OPTIMIZED_AWAY __attribute__((noinline, noipa, used))
#else
#define NOT_OPTIMIZED_AWAY __attribute__((noinline, used))
#endif

/* Several dozen bytes long, like calls.c's work(), so hooks have room. */
NOT_OPTIMIZED_AWAY int work(int x)
{
	volatile int scratch[4];
	int i, sum = 0;

	for (i = 0; i < 4; i++)
		scratch[i] = x + i;
	for (i = 0; i < 4; i++)
		sum += scratch[i];
	return sum;
}

int main(void)
{
	volatile long sink = 0;
	long total = 0, n;
	char line[64];

	printf("work=%p\n", (void *)work);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		n = strtol(line, NULL, 10);
		for (long i = 0; i < n; i++)
			sink += work((int)(total + i));
		total += n > 0 ? n : 0;
		printf("done total=%ld\n", total);
		fflush(stdout);
	}
	return 0;
}
