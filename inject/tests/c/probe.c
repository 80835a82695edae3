// SPDX-License-Identifier: MIT
/*
 * A library that proves it was loaded: its constructor appends
 * "loaded pid=<pid> tid=<tid> store=<name>" to $PROBE_OUT, where <name> is
 * read from /dev/shm/bpftime-inject-<pid> ("-" when absent), and unlinks that
 * file to say it is ready: the agent's side of the `bpftime attach` contract,
 * which it also declares with BPFTIME_ATTACH_CONTRACT (left out with
 * -DNO_CONTRACT; -DNO_READY leaves the file in place, as an agent that never
 * gets ready; -DREPORT_ERROR writes "error: probe refused" into it instead,
 * as an agent that cannot start). When "$PROBE_OUT.sleep" holds a number of milliseconds, it first
 * appends "sleeping" and sleeps that long (a slow constructor). It also
 * clobbers every vector register, as real code would, so a target whose
 * registers were not restored notices.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void append(const char *out, const char *line)
{
	FILE *f = fopen(out, "a");

	if (!f)
		return;
	fputs(line, f);
	fclose(f);
}

static void sleep_if_asked(const char *out)
{
	char path[4096];
	struct timespec ts;
	long ms = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s.sleep", out);
	f = fopen(path, "r");
	if (!f)
		return;
	if (fscanf(f, "%ld", &ms) != 1)
		ms = 0;
	fclose(f);
	append(out, "sleeping\n");
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (ms % 1000) * 1000000L;
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

static void clobber_vector_registers(void)
{
#ifdef __AVX__
	__asm__ volatile("vpcmpeqd %%ymm0, %%ymm0, %%ymm0\n\t"
			 "vmovdqa %%ymm0, %%ymm1\n\tvmovdqa %%ymm0, %%ymm2\n\t"
			 "vmovdqa %%ymm0, %%ymm3\n\tvmovdqa %%ymm0, %%ymm4\n\t"
			 "vmovdqa %%ymm0, %%ymm5\n\tvmovdqa %%ymm0, %%ymm6\n\t"
			 "vmovdqa %%ymm0, %%ymm7\n\tvmovdqa %%ymm0, %%ymm8\n\t"
			 "vmovdqa %%ymm0, %%ymm9\n\tvmovdqa %%ymm0, %%ymm10\n\t"
			 "vmovdqa %%ymm0, %%ymm11\n\tvmovdqa %%ymm0, %%ymm12\n\t"
			 "vmovdqa %%ymm0, %%ymm13\n\tvmovdqa %%ymm0, %%ymm14\n\t"
			 "vmovdqa %%ymm0, %%ymm15\n\t"
			 :
			 :
			 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5",
			   "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
			   "xmm12", "xmm13", "xmm14", "xmm15");
#else
	__asm__ volatile("pcmpeqd %%xmm0, %%xmm0\n\tmovdqa %%xmm0, %%xmm1\n\t"
			 "movdqa %%xmm0, %%xmm8\n\tmovdqa %%xmm0, %%xmm15\n\t"
			 :
			 :
			 : "xmm0", "xmm1", "xmm8", "xmm15");
#endif
}

#ifndef NO_CONTRACT
__attribute__((visibility("default"), used)) const unsigned int
	BPFTIME_ATTACH_CONTRACT = 1;
#endif

__attribute__((constructor)) static void probe_loaded(void)
{
	char hint[64], store[128] = "-", line[256];
	const char *out = getenv("PROBE_OUT");
	int fd;

	if (out)
		sleep_if_asked(out);
	clobber_vector_registers();
	snprintf(hint, sizeof(hint), "/dev/shm/bpftime-inject-%d", getpid());
	fd = open(hint, O_RDONLY);
	if (fd >= 0) {
		ssize_t n = read(fd, store, sizeof(store) - 1);

		store[n > 0 ? n : 0] = 0;
		close(fd);
#if defined(REPORT_ERROR)
		fd = open(hint, O_WRONLY | O_TRUNC);
		if (fd >= 0) {
			if (write(fd, "error: probe refused", 20) != 20)
				unlink(hint);
			close(fd);
		}
#elif !defined(NO_READY)
		unlink(hint);
#endif
	}
	if (!out)
		return;
	snprintf(line, sizeof(line), "loaded pid=%d tid=%ld store=%s\n",
		 getpid(), (long)syscall(SYS_gettid), store);
	append(out, line);
}
