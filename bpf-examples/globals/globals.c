// SPDX-License-Identifier: MIT
/*
 * globals: count calls of a function in the program's global variables,
 * through a bpftool-generated skeleton (globals.skel.h).
 *
 * Usage: globals --target BIN --func NAME [--parity 0|1]
 *
 * --parity is written into the program's .rodata before it is loaded. Once
 * the probe is attached the loader prints "ready", then obeys commands on
 * stdin, one per line:
 *
 *   weight N   set the .data variable `weight` to N (the program reads it on
 *              every call); prints "weight=N"
 *   show       prints "calls=C sum=S last_arg=A last_weight=W" from .bss
 *
 * At end of input (or SIGINT/SIGTERM) it prints the "show" line once more,
 * detaches and exits 0.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <bpf/libbpf.h>

#include "globals.skel.h"

static const char usage[] =
	"Usage: globals --target BIN --func NAME [--parity 0|1]\n"
	"Counts calls of BIN's NAME in BPF global variables; reads commands\n"
	"(`weight N`, `show`) on stdin until end of input.\n";

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void show(const struct globals_bpf *skel)
{
	/* The .bss section is mapped: these are the program's own variables. */
	printf("calls=%llu sum=%llu last_arg=%lld last_weight=%llu\n",
	       (unsigned long long)skel->bss->calls,
	       (unsigned long long)skel->bss->sum,
	       (long long)skel->bss->last_arg,
	       (unsigned long long)skel->bss->last_weight);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "target", required_argument, NULL, 't' },
		{ "func", required_argument, NULL, 'f' },
		{ "parity", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *target = NULL, *func = NULL;
	struct globals_bpf *skel;
	struct sigaction sa = { .sa_handler = on_signal };
	char line[128];
	int parity = -1, c, err = 0;

	while ((c = getopt_long(argc, argv, "t:f:p:h", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			target = optarg;
			break;
		case 'f':
			func = optarg;
			break;
		case 'p':
			parity = atoi(optarg);
			if (parity != 0 && parity != 1) {
				fprintf(stderr, "--parity takes 0 or 1\n%s", usage);
				return 2;
			}
			break;
		case 'h':
			printf("%s", usage);
			return 0;
		default:
			fprintf(stderr, "%s", usage);
			return 2;
		}
	}
	if (!target || !func || optind != argc) {
		fprintf(stderr, "%s", usage);
		return 2;
	}

	skel = globals_bpf__open();
	if (!skel) {
		fprintf(stderr, "cannot open the BPF skeleton: %s\n", strerror(errno));
		return 1;
	}
	/* .rodata is writable only until load; the program then sees it as constant. */
	skel->rodata->parity = parity;
	err = globals_bpf__load(skel);
	if (err) {
		fprintf(stderr, "cannot load the BPF skeleton: %s\n", strerror(-err));
		goto out;
	}

	LIBBPF_OPTS(bpf_uprobe_opts, uopts, .func_name = func);
	skel->links.count_call = bpf_program__attach_uprobe_opts(
		skel->progs.count_call, -1, target, 0, &uopts);
	if (!skel->links.count_call) {
		err = -errno;
		fprintf(stderr, "cannot attach to %s:%s: %s\n", target, func,
			strerror(errno));
		goto out;
	}

	/* No SA_RESTART: a signal ends the fgets() below. */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	printf("ready\n");
	fflush(stdout);

	while (!stop && fgets(line, sizeof(line), stdin)) {
		unsigned long long w;

		if (sscanf(line, "weight %llu", &w) == 1) {
			skel->data->weight = w;
			printf("weight=%llu\n", w);
			fflush(stdout);
		} else if (strncmp(line, "show", 4) == 0) {
			show(skel);
		} else {
			fprintf(stderr, "unknown command: %s", line);
		}
	}
	show(skel);
out:
	globals_bpf__destroy(skel);
	return err ? 1 : 0;
}
