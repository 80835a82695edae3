// SPDX-License-Identifier: MIT
/*
 * syscalls: a deterministic workload of system calls for the syscall tracepoint tests.
 *
 * Usage: syscalls ROUNDS THREADS FILE...
 *
 * THREADS threads, started together, each open every FILE ROUNDS times in three ways:
 * through the C library's open() (an openat with O_RDONLY|O_CLOEXEC), through its
 * syscall() (openat with O_RDONLY|O_NONBLOCK), and with a `syscall` instruction of our
 * own (openat with O_RDONLY|O_NOCTTY, mode 0640), closing what opened; and call getppid
 * once per round through the C library and once with an instruction of our own. Then a
 * forked child does one round on its own thread. Prints "done" with the totals and the
 * calls whose result was wrong (an open of a file that exists failing, or of one that does
 * not succeeding, getppid not the parent's), and exits 1 if there was any.
 *
 * With SYSCALLS_WAIT in the environment it first prints "pid=<pid>" and waits for a line
 * on stdin, so that a tool can be pointed at it (syscount -p) before it starts. With
 * SYSCALLS_SECCOMP it first installs a seccomp filter that allows every call.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int rounds, nfiles;
static char **files;
static int *exists;
static pid_t parent;
static pthread_barrier_t start;
/* Calls whose result was not what the files and the process say it must be. */
static int errors;

static long raw3(long nr, long a, long b, long c, long d)
{
	long ret;
	register long r10 __asm__("r10") = d;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

static void check(int ok)
{
	if (!ok)
		__atomic_fetch_add(&errors, 1, __ATOMIC_RELAXED);
}

static void one_round(void)
{
	for (int f = 0; f < nfiles; f++) {
		int fd = open(files[f], O_RDONLY | O_CLOEXEC);
		check((fd >= 0) == exists[f]);
		if (fd >= 0)
			close(fd);
		fd = syscall(SYS_openat, AT_FDCWD, files[f], O_RDONLY | O_NONBLOCK, 0);
		check((fd >= 0) == exists[f]);
		if (fd >= 0)
			close(fd);
		fd = raw3(SYS_openat, AT_FDCWD, (long)files[f], O_RDONLY | O_NOCTTY, 0640);
		check((fd >= 0) == exists[f] && (fd >= 0 || fd == -2));
		if (fd >= 0)
			close(fd);
	}
	check(getppid() == parent);
	check(raw3(SYS_getppid, 0, 0, 0, 0) == parent);
}

static void *worker(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&start);
	for (int r = 0; r < rounds; r++)
		one_round();
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s ROUNDS THREADS FILE...\n", argv[0]);
		return 2;
	}
	if (getenv("SYSCALLS_SECCOMP")) {
		struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
		struct sock_fprog prog = { .len = 1, .filter = &allow };

		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
		    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
			perror("seccomp");
			return 1;
		}
	}
	if (getenv("SYSCALLS_WAIT")) {
		char line[16];

		printf("pid=%d\n", getpid());
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	rounds = atoi(argv[1]);
	int threads = atoi(argv[2]);
	files = argv + 3;
	nfiles = argc - 3;
	exists = calloc(nfiles, sizeof(*exists));
	for (int f = 0; f < nfiles; f++)
		exists[f] = access(files[f], F_OK) == 0;
	parent = getppid();
	pthread_t *t = calloc(threads, sizeof(*t));
	pthread_barrier_init(&start, NULL, threads);
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < threads; i++)
		pthread_join(t[i], NULL);
	pid_t child = fork();
	if (child == 0) {
		parent = getppid();
		one_round();
		_exit(errors ? 1 : 0);
	}
	int status = 0;
	waitpid(child, &status, 0);
	printf("done opens=%d getppids=%d child=%d errors=%d\n", 3 * nfiles * (rounds * threads + 1),
	       2 * (rounds * threads + 1), WIFEXITED(status) ? WEXITSTATUS(status) : -1, errors);
	return errors ? 1 : 0;
}
