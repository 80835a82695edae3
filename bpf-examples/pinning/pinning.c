// SPDX-License-Identifier: MIT
/*
 * pinning: pins and reopens maps and links through libbpf, driven on stdin,
 * for tests that compare bpffs behaviour with the kernel's.
 *
 * Usage: pinning [--obj FILE] [--pin-root DIR]
 *
 * Opens and loads pinning.bpf.o (its `counts` map is pinned by name under
 * --pin-root, default /sys/fs/bpf, or reused from there), prints "loaded",
 * then obeys one command per line and answers with one line each; a result
 * R is 0 or a negative errno:
 *
 *   attach BIN FUNC   attach count_call to BIN's FUNC      -> attach=R
 *   get K / set K V   counts[K] (the loaded object's map)  -> value=V | value=R, set=R
 *   pin_scratch PATH  bpf_obj_pin(scratch's fd, PATH)      -> pin=R
 *   pin_link PATH     bpf_link__pin(the attach link, PATH) -> pin=R
 *   obj_get PATH      bpf_obj_get(PATH), kept as "the fd"  -> get=R [type= key= value= max=]
 *   fd_get K          lookup K in the fd's map             -> value=V | value=R
 *   close_fd          close the fd                         -> closed
 *   unlink PATH       unlink(PATH)                         -> unlink=R
 *   unpin_counts      bpf_map__unpin(counts, NULL)         -> unpin=R
 *   destroy_link      bpf_link__destroy(the attach link)   -> destroyed
 *   ids               counts' and scratch's map ids        -> ids counts=A scratch=B
 *
 * Exits 0 at end of input, closing everything it holds.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "pinning.h"

static const char usage[] = "Usage: pinning [--obj FILE] [--pin-root DIR]\n";

static int err_of(int r)
{
	return r < 0 ? -errno : 0;
}

static void map_id(int fd, __u32 *id)
{
	struct bpf_map_info info;
	__u32 len = sizeof(info);

	memset(&info, 0, sizeof(info));
	*id = bpf_obj_get_info_by_fd(fd, &info, &len) ? 0 : info.id;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "obj", required_argument, NULL, 'o' },
		{ "pin-root", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char default_obj[4096], line[4096], a[4096], b[4096];
	const char *obj_path = NULL, *pin_root = NULL;
	struct bpf_object *obj;
	struct bpf_map *counts, *scratch;
	struct bpf_program *prog;
	struct bpf_link *link = NULL;
	int c, fd = -1;

	while ((c = getopt_long(argc, argv, "o:p:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			obj_path = optarg;
			break;
		case 'p':
			pin_root = optarg;
			break;
		case 'h':
			printf("%s", usage);
			return 0;
		default:
			fprintf(stderr, "%s", usage);
			return 2;
		}
	}
	if (!obj_path) {
		ssize_t n = readlink("/proc/self/exe", default_obj, sizeof(default_obj) - 16);
		if (n < 0)
			return 1;
		default_obj[n] = 0;
		strcat(default_obj, ".bpf.o");
		obj_path = default_obj;
	}
	LIBBPF_OPTS(bpf_object_open_opts, oopts, .pin_root_path = pin_root);
	obj = bpf_object__open_file(obj_path, &oopts);
	if (!obj) {
		fprintf(stderr, "cannot open %s: %s\n", obj_path, strerror(errno));
		return 1;
	}
	if (bpf_object__load(obj)) {
		fprintf(stderr, "cannot load %s: %s\n", obj_path, strerror(errno));
		return 1;
	}
	counts = bpf_object__find_map_by_name(obj, "counts");
	scratch = bpf_object__find_map_by_name(obj, "scratch");
	prog = bpf_object__find_program_by_name(obj, "count_call");
	if (!counts || !scratch || !prog)
		return 1;
	printf("loaded\n");
	fflush(stdout);

	while (fgets(line, sizeof(line), stdin)) {
		unsigned long long k = 0, v = 0;
		__u32 key;
		__u64 val;

		a[0] = b[0] = 0;
		if (sscanf(line, "attach %4095s %4095s", a, b) == 2) {
			LIBBPF_OPTS(bpf_uprobe_opts, uopts, .func_name = b);
			link = bpf_program__attach_uprobe_opts(prog, -1, a, 0, &uopts);
			printf("attach=%d\n", link ? 0 : -errno);
		} else if (sscanf(line, "get %llu", &k) == 1) {
			key = k;
			if (bpf_map_lookup_elem(bpf_map__fd(counts), &key, &val))
				printf("value=%d\n", -errno);
			else
				printf("value=%llu\n", (unsigned long long)val);
		} else if (sscanf(line, "set %llu %llu", &k, &v) == 2) {
			key = k;
			val = v;
			printf("set=%d\n", err_of(bpf_map_update_elem(bpf_map__fd(counts), &key, &val, 0)));
		} else if (sscanf(line, "pin_scratch %4095s", a) == 1) {
			printf("pin=%d\n", err_of(bpf_obj_pin(bpf_map__fd(scratch), a)));
		} else if (sscanf(line, "pin_link %4095s", a) == 1) {
			printf("pin=%d\n", link ? bpf_link__pin(link, a) : -EBADF);
		} else if (sscanf(line, "obj_get %4095s", a) == 1) {
			if (fd >= 0)
				close(fd);
			fd = bpf_obj_get(a);
			if (fd < 0) {
				printf("get=%d\n", -errno);
			} else {
				struct bpf_map_info info;
				__u32 len = sizeof(info);

				memset(&info, 0, sizeof(info));
				if (bpf_obj_get_info_by_fd(fd, &info, &len))
					printf("get=0 info=%d\n", -errno);
				else
					printf("get=0 type=%u key=%u value=%u max=%u\n", info.type,
					       info.key_size, info.value_size, info.max_entries);
			}
		} else if (sscanf(line, "fd_get %llu", &k) == 1) {
			key = k;
			if (bpf_map_lookup_elem(fd, &key, &val))
				printf("value=%d\n", -errno);
			else
				printf("value=%llu\n", (unsigned long long)val);
		} else if (strncmp(line, "close_fd", 8) == 0) {
			close(fd);
			fd = -1;
			printf("closed\n");
		} else if (sscanf(line, "unlink %4095s", a) == 1) {
			printf("unlink=%d\n", err_of(unlink(a)));
		} else if (strncmp(line, "unpin_counts", 12) == 0) {
			printf("unpin=%d\n", bpf_map__unpin(counts, NULL));
		} else if (strncmp(line, "destroy_link", 12) == 0) {
			bpf_link__destroy(link);
			link = NULL;
			printf("destroyed\n");
		} else if (strncmp(line, "ids", 3) == 0) {
			__u32 ci, si;

			map_id(bpf_map__fd(counts), &ci);
			map_id(bpf_map__fd(scratch), &si);
			printf("ids counts=%u scratch=%u\n", ci, si);
		} else {
			printf("unknown command: %s", line);
		}
		fflush(stdout);
	}
	if (fd >= 0)
		close(fd);
	bpf_link__destroy(link);
	bpf_object__close(obj);
	return 0;
}
