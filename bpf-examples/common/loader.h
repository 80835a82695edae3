/* SPDX-License-Identifier: MIT */
/*
 * Small helpers shared by the example loaders: command-line parsing,
 * finding the BPF object next to the loader, resolving a shared library
 * name such as "libc.so.6" to a path, and waiting for SIGINT/SIGTERM.
 *
 * Everything here is plain libc + libbpf; there is nothing bpftime-specific.
 */
#ifndef BPF_EXAMPLES_LOADER_H
#define BPF_EXAMPLES_LOADER_H

#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/libbpf.h>

#define LOADER_MAX_OUTER 4

struct loader_args {
	const char *target; /* --target: binary or library to probe */
	const char *func;   /* --func: function name inside target */
	const char *obj;    /* --obj: path of the .bpf.o (default: beside us) */
	bool verbose;       /* --verbose: show libbpf's debug messages */
	bool sizes;         /* --sizes: extra per-size output (malloc_count) */
	/* --outer, repeatable: callers of --func to put uretprobes on (stacks) */
	const char *outer[LOADER_MAX_OUTER];
	int n_outer;
};

static bool verbose_libbpf;

/* Forward libbpf's messages to stderr; hide debug chatter unless -v. */
static inline int libbpf_print(enum libbpf_print_level level, const char *fmt,
			va_list ap)
{
	if (level == LIBBPF_DEBUG && !verbose_libbpf)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

/*
 * Parse the common options. `usage` is printed for --help and on errors.
 * Returns 0 on success, 1 if the program should exit successfully (help),
 * -1 on a usage error.
 */
static inline int parse_args(int argc, char **argv, struct loader_args *args,
		      const char *usage)
{
	static const struct option opts[] = {
		{ "target", required_argument, NULL, 't' },
		{ "func", required_argument, NULL, 'f' },
		{ "obj", required_argument, NULL, 'o' },
		{ "sizes", no_argument, NULL, 's' },
		{ "outer", required_argument, NULL, 'O' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	while ((c = getopt_long(argc, argv, "t:f:o:O:svh", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			args->target = optarg;
			break;
		case 'f':
			args->func = optarg;
			break;
		case 'o':
			args->obj = optarg;
			break;
		case 's':
			args->sizes = true;
			break;
		case 'O':
			if (args->n_outer == LOADER_MAX_OUTER) {
				fprintf(stderr, "at most %d --outer functions\n%s",
					LOADER_MAX_OUTER, usage);
				return -1;
			}
			args->outer[args->n_outer++] = optarg;
			break;
		case 'v':
			args->verbose = true;
			break;
		case 'h':
			printf("%s", usage);
			return 1;
		default:
			fprintf(stderr, "%s", usage);
			return -1;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "unexpected argument: %s\n%s", argv[optind],
			usage);
		return -1;
	}
	verbose_libbpf = args->verbose;
	libbpf_set_print(libbpf_print);
	return 0;
}

/*
 * Default object path: "<directory of this executable>/<name>". We look at
 * /proc/self/exe so the loader works from any working directory.
 */
static inline int default_obj_path(const char *name, char *buf, size_t len)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	if (n < 0) {
		fprintf(stderr, "cannot read /proc/self/exe: %s\n",
			strerror(errno));
		return -1;
	}
	exe[n] = '\0';
	if ((size_t)snprintf(buf, len, "%s/%s", dirname(exe), name) >= len) {
		fprintf(stderr, "object path too long\n");
		return -1;
	}
	return 0;
}

/*
 * Turn a bare library name ("libc.so.6") into the path this very process
 * loaded it from, by scanning /proc/self/maps. Names containing a '/' are
 * returned unchanged. This finds the same file the dynamic linker would
 * pick for the programs we want to trace.
 */
static inline int resolve_library(const char *name, char *buf, size_t len)
{
	char line[PATH_MAX + 256];
	size_t name_len = strlen(name);
	FILE *maps;
	int err = -1;

	if (strchr(name, '/')) {
		if ((size_t)snprintf(buf, len, "%s", name) >= len)
			return -1;
		return 0;
	}

	maps = fopen("/proc/self/maps", "r");
	if (!maps)
		return -1;
	while (fgets(line, sizeof(line), maps)) {
		char *path = strchr(line, '/');
		char *base;

		if (!path)
			continue;
		path[strcspn(path, "\n")] = '\0';
		base = strrchr(path, '/') + 1;
		if (strncmp(base, name, name_len) == 0 &&
		    strlen(path) < len) {
			strcpy(buf, path);
			err = 0;
			break;
		}
	}
	fclose(maps);
	return err;
}

/* Set by SIGINT or SIGTERM once catch_exit_signals() has run. */
static volatile sig_atomic_t exit_requested __attribute__((unused));

static inline void on_exit_signal(int sig)
{
	(void)sig;
	exit_requested = 1;
}

/*
 * For loaders that poll a ring buffer until SIGINT/SIGTERM. SA_RESTART, or a
 * Ctrl-C that lands while printf() waits on a slow reader makes write() fail
 * with EINTR, and stdio drops the buffer it was writing: events lost.
 * epoll_wait() is never restarted, so ring_buffer__poll() still returns
 * -EINTR and the polling loop gets to test exit_requested.
 */
static inline void catch_exit_signals(void)
{
	struct sigaction sa = { .sa_handler = on_exit_signal,
				.sa_flags = SA_RESTART };

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/*
 * Block SIGINT and SIGTERM so they stay pending until wait_for_signal()
 * collects them; call this before attaching so no signal is lost.
 */
static inline void block_exit_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGTERM);
	sigprocmask(SIG_BLOCK, set, NULL);
}

static inline void wait_for_signal(const sigset_t *set)
{
	int sig;

	while (sigwait(set, &sig) != 0)
		;
}

/* Tell whoever started us that the probes are live. */
static inline void announce_ready(void)
{
	printf("ready\n");
	fflush(stdout);
}

/* Find a map by name or report a clear error. */
static inline struct bpf_map *must_find_map(struct bpf_object *obj,
					    const char *name)
{
	struct bpf_map *map = bpf_object__find_map_by_name(obj, name);

	if (!map)
		fprintf(stderr, "map '%s' not found in object\n", name);
	return map;
}

/* Open and load the BPF object at `path`, with a clear message on error. */
static inline struct bpf_object *open_and_load(const char *path)
{
	struct bpf_object *obj;
	int err;

	obj = bpf_object__open_file(path, NULL);
	if (!obj) {
		fprintf(stderr, "cannot open BPF object %s: %s\n", path,
			strerror(errno));
		return NULL;
	}
	err = bpf_object__load(obj);
	if (err) {
		fprintf(stderr, "cannot load BPF object %s: %s\n", path,
			strerror(-err));
		bpf_object__close(obj);
		return NULL;
	}
	return obj;
}

/* Attach `prog_name` as a uprobe (or uretprobe) on target:func, all pids. */
static inline struct bpf_link *attach_uprobe(struct bpf_object *obj,
				      const char *prog_name,
				      const char *target, const char *func,
				      bool retprobe)
{
	LIBBPF_OPTS(bpf_uprobe_opts, opts, .func_name = func,
		    .retprobe = retprobe);
	struct bpf_program *prog;
	struct bpf_link *link;

	prog = bpf_object__find_program_by_name(obj, prog_name);
	if (!prog) {
		fprintf(stderr, "program '%s' not found in object\n",
			prog_name);
		return NULL;
	}
	/* pid -1: every process that maps `target`; offset 0 + func_name:
	 * libbpf looks the symbol up in the ELF file for us. */
	link = bpf_program__attach_uprobe_opts(prog, -1, target, 0, &opts);
	if (!link) {
		fprintf(stderr, "cannot attach %s to %s:%s: %s\n",
			retprobe ? "uretprobe" : "uprobe", target, func,
			strerror(errno));
		return NULL;
	}
	return link;
}

#endif /* BPF_EXAMPLES_LOADER_H */
