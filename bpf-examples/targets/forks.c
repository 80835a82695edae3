// SPDX-License-Identifier: MIT
/*
 * forks N: makes processes and threads every way a program does, N times each, for the
 * syscall tracepoint tests: the C library's fork() (clone, with its malloc locks held over
 * the call), a fork system call of its own (fork), vfork() (vfork), posix_spawn() of
 * /bin/true (clone with CLONE_VM|CLONE_VFORK, on a stack of the C library's) and
 * pthread_create() (clone3 with a new thread's TLS). Every child checks that getpid()
 * is not its parent's and exits; threads return at once. Prints "forks=<made> errors=<n>"
 * and exits 1 on an error.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static pid_t parent;

static void *thread_main(void *arg)
{
	return arg;
}

/* Waits for child `pid` and says whether it exited 0. */
static int reaped(pid_t pid)
{
	int status;

	return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
	       WEXITSTATUS(status) == 0;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 1;
	int made = 0, errors = 0;

	parent = getpid();
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid == 0)
			_exit(getpid() == parent);
		errors += !reaped(pid);

		pid = (pid_t)syscall(SYS_fork);
		if (pid == 0)
			_exit(getpid() == parent);
		errors += !reaped(pid);

		pid = vfork();
		if (pid == 0)
			_exit(0);
		errors += !reaped(pid);

		char *args[] = { "/bin/true", NULL };
		errors += posix_spawn(&pid, "/bin/true", NULL, NULL, args, environ) != 0 ||
			  !reaped(pid);

		pthread_t t;
		errors += pthread_create(&t, NULL, thread_main, NULL) != 0 ||
			  pthread_join(t, NULL) != 0;
		made += 5;
	}
	printf("forks=%d errors=%d\n", made, errors);
	return errors != 0;
}
