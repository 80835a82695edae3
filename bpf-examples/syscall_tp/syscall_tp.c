// SPDX-License-Identifier: MIT
/*
 * syscall_tp: system call tracepoints of the processes named --comm (their command
 * name, as /proc/PID/comm shows it).
 *
 * Usage: syscall_tp --comm NAME [--prefix PATH] [--obj FILE]
 *
 * Prints "ready" once attached, then a line per openat as it returns:
 *
 *   open tid=<tid> nr=<__syscall_nr> dfd=<dfd> flags=<flags> mode=<mode> ret=<ret> file=<filename>
 *
 * and, after SIGINT or SIGTERM, a line per system call number seen at entry (through
 * raw_tracepoint/sys_enter) and at return (raw_tracepoint/sys_exit):
 *
 *   count key=<number> n=<calls>          (entries; key 1000: openat under --prefix)
 *   count key=<2000 + number> n=<calls>   (returns)
 */
#include <bpf/bpf.h>
#include <unistd.h>

#include "../common/loader.h"
#include "syscall_tp.h"

static int handle_event(void *ctx, void *data, size_t size)
{
	const struct open_event *e = data;

	(void)ctx;
	if (size < sizeof(*e))
		return 0;
	printf("open tid=%u nr=%d dfd=%lld flags=%lld mode=%lld ret=%lld file=%s\n", e->tid,
	       e->nr, (long long)e->dfd, (long long)e->flags, (long long)e->mode,
	       (long long)e->ret, e->filename);
	return 0;
}

int main(int argc, char **argv)
{
	const char *comm = NULL, *prefix = "", *obj_path = NULL;
	char default_obj[PATH_MAX];
	struct bpf_object *obj;
	struct bpf_program *prog;
	struct ring_buffer *rb;
	int opt;

	while ((opt = getopt(argc, argv, "c:p:o:")) != -1) {
		switch (opt) {
		case 'c': comm = optarg; break;
		case 'p': prefix = optarg; break;
		case 'o': obj_path = optarg; break;
		default:
			fprintf(stderr, "usage: %s -c COMM [-p PREFIX] [-o OBJ]\n", argv[0]);
			return 2;
		}
	}
	if (!comm || strlen(comm) > 15 || strlen(prefix) > 63) {
		fprintf(stderr, "usage: %s -c COMM (at most 15 bytes) [-p PREFIX (at most 63)] [-o OBJ]\n", argv[0]);
		return 2;
	}
	libbpf_set_print(libbpf_print);
	if (!obj_path) {
		if (default_obj_path("syscall_tp.bpf.o", default_obj, sizeof(default_obj)))
			return 1;
		obj_path = default_obj;
	}
	obj = bpf_object__open_file(obj_path, NULL);
	if (!obj) {
		fprintf(stderr, "cannot open %s: %s\n", obj_path, strerror(errno));
		return 1;
	}
	{
		/* The object's read-only globals, in declaration order. */
		struct {
			char comm[16];
			char prefix[64];
			unsigned prefix_len;
		} v = {};
		struct bpf_map *rodata = bpf_object__find_map_by_name(obj, ".rodata");

		memcpy(v.comm, comm, strlen(comm));
		memcpy(v.prefix, prefix, strlen(prefix));
		v.prefix_len = strlen(prefix);
		if (!rodata || bpf_map__set_initial_value(rodata, &v, sizeof(v))) {
			fprintf(stderr, "cannot configure the object's .rodata\n");
			return 1;
		}
	}
	if (bpf_object__load(obj)) {
		fprintf(stderr, "cannot load %s: %s\n", obj_path, strerror(errno));
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		if (!bpf_program__attach(prog)) {
			fprintf(stderr, "cannot attach %s: %s\n", bpf_program__name(prog),
				strerror(errno));
			return 1;
		}
	}
	rb = ring_buffer__new(bpf_object__find_map_fd_by_name(obj, "events"), handle_event,
			      NULL, NULL);
	if (!rb) {
		fprintf(stderr, "cannot open the ring buffer: %s\n", strerror(errno));
		return 1;
	}
	catch_exit_signals();
	printf("ready\n");
	fflush(stdout);
	while (!exit_requested) {
		int err = ring_buffer__poll(rb, 100);

		if (err < 0 && err != -EINTR) {
			fprintf(stderr, "ring_buffer__poll: %d\n", err);
			break;
		}
		fflush(stdout);
	}
	ring_buffer__consume(rb);
	{
		int fd = bpf_object__find_map_fd_by_name(obj, "counts");
		__u32 key, next, *prev = NULL;
		__u64 n;

		while (bpf_map_get_next_key(fd, prev, &next) == 0) {
			if (bpf_map_lookup_elem(fd, &next, &n) == 0)
				printf("count key=%u n=%llu\n", next, (unsigned long long)n);
			key = next;
			prev = &key;
		}
	}
	fflush(stdout);
	ring_buffer__free(rb);
	bpf_object__close(obj);
	return 0;
}
