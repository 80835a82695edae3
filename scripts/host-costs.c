/*
 * What a uprobe pair's fixed costs are made of on this host, per operation: a map lock
 * (an uncontended `lock cmpxchg` and a releasing store, alone and after 24 stores, as a
 * hook's register save leaves them in the store buffer), a `lock xadd` (a program's
 * __sync_fetch_and_add), `rdtsc` (each bpf_ktime_get_ns) and the vDSO's clock_gettime.
 * One thread, no contention: the floor these instructions set on this CPU.
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <x86intrin.h>

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static volatile uint32_t lock_word;
static volatile uint64_t words[64];

static void lock_unlock(void)
{
	uint32_t free_value = 0;
	__atomic_compare_exchange_n(&lock_word, &free_value, 1, 0, __ATOMIC_ACQUIRE,
				    __ATOMIC_RELAXED);
	__atomic_store_n(&lock_word, 0, __ATOMIC_RELEASE);
}

int main(void)
{
	const int n = 20000000;
	volatile uint64_t sink = 0;
	double t0, stores, stores_lock, lock, xadd, tsc, vdso;

	t0 = now_ns();
	for (int i = 0; i < n; i++)
		for (int j = 0; j < 24; j++)
			words[j] = i;
	stores = (now_ns() - t0) / n;
	t0 = now_ns();
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 24; j++)
			words[j] = i;
		lock_unlock();
	}
	stores_lock = (now_ns() - t0) / n;
	t0 = now_ns();
	for (int i = 0; i < n; i++)
		lock_unlock();
	lock = (now_ns() - t0) / n;
	t0 = now_ns();
	for (int i = 0; i < n; i++)
		__atomic_fetch_add(&words[40], 1, __ATOMIC_RELAXED);
	xadd = (now_ns() - t0) / n;
	t0 = now_ns();
	for (int i = 0; i < n / 2; i++)
		sink += __rdtsc();
	tsc = (now_ns() - t0) / (n / 2);
	t0 = now_ns();
	for (int i = 0; i < n / 2; i++) {
		struct timespec t;
		clock_gettime(CLOCK_MONOTONIC, &t);
		sink += t.tv_nsec;
	}
	vdso = (now_ns() - t0) / (n / 2);
	printf("lock+unlock %.2f ns (after 24 stores: %.2f ns added); lock xadd %.2f ns; "
	       "rdtsc %.2f ns; clock_gettime %.2f ns\n",
	       lock, stores_lock - stores, xadd, tsc, vdso);
	return 0;
}
