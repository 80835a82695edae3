// SPDX-License-Identifier: MIT
/*
 * A process to inject into, in one of three states.
 *
 *   target read        prints "ready", blocks in read(0), then prints
 *                      "got <what it read>" and exits 7
 *   target sleep MS    prints "ready", makes one nanosleep(MS) (no retry on
 *                      EINTR), prints "slept_ms=<elapsed> rc=<rc>" and exits 0
 *                      (3 if nanosleep failed)
 *   target threads     as read, while a second thread allocates and frees
 *                      memory in a loop
 *   target leader-exits
 *                      as read, from a second thread: the main thread has
 *                      exited (pthread_exit) by the time "ready" is printed
 *   target spin        prints "ready", spins with its state in registers
 *                      (vector and integer) until SIGUSR1, then recomputes
 *                      that state from scratch and prints "spin n=<iterations>
 *                      ok" and exits 0, or "spin ... mismatch" and exits 4
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef double v4d __attribute__((vector_size(32)));

static volatile sig_atomic_t stop;

static void on_usr1(int sig)
{
	(void)sig;
	stop = 1;
}

struct state {
	v4d acc;
	uint64_t x;
};

static inline void step(struct state *s, uint64_t n)
{
	const v4d k = { 1.0000001, 0.9999999, 1.0000003, 0.9999997 };
	v4d add = { (double)(n & 7), (double)(n & 3), 0.5, (double)(n & 1) };

	s->acc = s->acc * k + add;
	s->x ^= s->x << 13;
	s->x ^= s->x >> 7;
	s->x ^= s->x << 17;
}

static const struct state initial = { { 1, 2, 3, 4 }, 88172645463325252ULL };

/*
 * Out of line, so that nothing the spinning loop holds in registers (its
 * constants included) is reused here: a clobbered register must show.
 */
__attribute__((noinline)) static void recompute(uint64_t n, struct state *out)
{
	struct state s = initial;
	uint64_t i;

	for (i = 0; i < n; i++)
		step(&s, i);
	*out = s;
}

static int spin(void)
{
	struct state live = initial, again;
	struct sigaction sa;
	uint64_t n = 0;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	printf("ready\n");
	fflush(stdout);
	while (!stop) {
		step(&live, n);
		n++;
	}
	recompute(n, &again);
	if (memcmp(&live.acc, &again.acc, sizeof(v4d)) || live.x != again.x) {
		printf("spin n=%llu mismatch\n", (unsigned long long)n);
		return 4;
	}
	printf("spin n=%llu ok\n", (unsigned long long)n);
	return 0;
}

static int read_line(void)
{
	char buf[256];
	ssize_t n;

	n = read(0, buf, sizeof(buf) - 1);
	if (n < 0) {
		printf("read failed: errno %d\n", errno);
		return 5;
	}
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	printf("got %s\n", buf);
	return 7;
}

static void *allocate_forever(void *arg)
{
	volatile char *sink;

	(void)arg;
	for (;;) {
		sink = malloc(64 + (rand() & 1023));
		if (sink)
			sink[0] = 1;
		free((void *)sink);
	}
	return NULL;
}

static void *read_then_exit(void *arg)
{
	pid_t leader = *(pid_t *)arg;
	char path[64], state = 0;
	FILE *f;

	/* "ready" only once the main thread is gone. */
	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", leader, leader);
	while (state != 'Z') {
		f = fopen(path, "r");
		if (!f || fscanf(f, "%*d (%*[^)]) %c", &state) != 1)
			state = 0;
		if (f)
			fclose(f);
		usleep(1000);
	}
	printf("ready\n");
	fflush(stdout);
	exit(read_line());
}

static long ms_since(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (t1.tv_sec - t0->tv_sec) * 1000 +
	       (t1.tv_nsec - t0->tv_nsec) / 1000000;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "read") == 0) {
		printf("ready\n");
		fflush(stdout);
		return read_line();
	}
	if (argc == 2 && strcmp(argv[1], "threads") == 0) {
		pthread_t t;

		pthread_create(&t, NULL, allocate_forever, NULL);
		printf("ready\n");
		fflush(stdout);
		return read_line();
	}
	if (argc == 2 && strcmp(argv[1], "leader-exits") == 0) {
		static pid_t leader;
		pthread_t t;

		leader = getpid();
		pthread_create(&t, NULL, read_then_exit, &leader);
		pthread_exit(NULL);
	}
	if (argc == 3 && strcmp(argv[1], "sleep") == 0) {
		long ms = atol(argv[2]);
		struct timespec t0, req = { ms / 1000, (ms % 1000) * 1000000L };
		int rc;

		printf("ready\n");
		fflush(stdout);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = nanosleep(&req, NULL);
		printf("slept_ms=%ld rc=%d\n", ms_since(&t0), rc);
		return rc ? 3 : 0;
	}
	if (argc == 2 && strcmp(argv[1], "spin") == 0)
		return spin();
	fprintf(stderr, "usage: target read | threads | leader-exits | sleep MS | spin\n");
	return 2;
}
