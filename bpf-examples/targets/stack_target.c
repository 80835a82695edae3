// SPDX-License-Identifier: MIT
/*
 * stack_target: known call chains for stack-trace tests.
 *
 * Usage: stack_target N
 *
 * Calls leaf() N times through main -> drive -> top_a -> mid -> leaf, then
 * N times through main -> drive -> top_b -> mid -> leaf (leaf's argument
 * counts 0 .. 2N-1), and exits 0: five frames of this executable under leaf's
 * entry, whatever libc's frames look like. Built without PIE and with frame pointers, and with no tail
 * calls or inlining, so every frame is in the chain and every return address
 * is the same in every run.
 */
#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__) && !defined(__clang__)
#define KEEP __attribute__((noinline, noipa, used))
#else
#define KEEP __attribute__((noinline, used))
#endif

KEEP int leaf(int x)
{
	volatile int scratch[4];
	int i, sum = 0;

	for (i = 0; i < 4; i++)
		scratch[i] = x + i;
	for (i = 0; i < 4; i++)
		sum += scratch[i];
	return sum;
}

KEEP int mid(int x)
{
	return leaf(x) + 1;
}

KEEP int top_a(int x)
{
	return mid(x) + 2;
}

KEEP int top_b(int x)
{
	return mid(x) * 3;
}

KEEP int drive(int path, int x)
{
	if (path)
		return top_b(x) + 4;
	return top_a(x) + 5;
}

int main(int argc, char **argv)
{
	volatile long sink = 0;
	long n;

	if (argc != 2 || (n = strtol(argv[1], NULL, 10)) < 0) {
		fprintf(stderr, "Usage: stack_target N\n");
		return 2;
	}
	for (long i = 0; i < n; i++)
		sink += drive(0, (int)i);
	for (long i = 0; i < n; i++)
		sink += drive(1, (int)(n + i));
	return 0;
}
