// SPDX-License-Identifier: MIT
/*
 * signals N: sends itself SIGUSR1 (ignored) N times with kill() and N times with tgkill(),
 * then kill()s a pid that does not exist (ESRCH), for the syscall tracepoint tests.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 1;

	signal(SIGUSR1, SIG_IGN);
	for (int i = 0; i < n; i++)
		kill(getpid(), SIGUSR1);
	for (int i = 0; i < n; i++)
		syscall(SYS_tgkill, getpid(), gettid(), SIGUSR1);
	/* Pids stop at 2^22 on Linux: this one never exists. */
	return kill(1 << 22 | 12345, SIGUSR1) == 0;
}
