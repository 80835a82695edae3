// SPDX-License-Identifier: MIT
/*
 * gpu_maps: loads gpu_maps.bpf.o (bpftime's GPU map types on vectorAdd), attaches its
 * programs where their sections say, and reads the maps as a bpftime user's loader
 * does:
 *
 * - the GPU ring buffer `events` through bpftime's poll function,
 *   `bpftime_syscall_server__poll_gpu_ringbuf_map(map_fd, ctx, callback)`, found with
 *   dlsym(RTLD_DEFAULT) in the preloaded syscall library, every 20 ms and once more at
 *   the end; with GPU_MAPS_READER=ringbuf in the environment, through libbpf's ring
 *   buffer API instead, as a tool reads a standard ring buffer; with GPU_MAPS_READER=perf,
 *   through its perf buffer API (perf_buffer__new, which bpftime allows where
 *   BPFTIME_GPU_RING_AS=perf shows the map as a perf event array), a sample's size
 *   rounded up as the kernel rounds it;
 * - the per-thread array `per_thread` with bpf_map_lookup_elem into a buffer of one
 *   value per GPU thread, as many as the map was made for: BPFTIME_MAP_GPU_THREAD_COUNT
 *   in our environment (the loader's is the one bpftime reads), else 1024;
 * - the GPU array `totals` and the GPU hash map `by_block` as any array and hash map.
 *
 * Usage: gpu_maps [--obj FILE] [--verbose]
 *
 * Prints `map NAME id=ID` for each map and `ready` once attached; at SIGINT/SIGTERM,
 * one line per map of `name=value` words (what scripts/gpu-examples.sh and the tests
 * check):
 *
 *   per_thread threads=T calls_min= calls_max= calls_zero= ids_in_order=
 *   totals entries= elements= exits= refused=
 *   by_block keys= min= max= sum=
 *   events reader=poll|ringbuf|perf records= size_bad= field_bad= threads= per_thread_min=
 *          per_thread_max= poll_errors=
 *   perf lost=          (with GPU_MAPS_READER=perf: what the perf buffer said it lost)
 *
 * `ids_in_order` counts the threads t whose PT_ID value is t + 1: each thread's value
 * sits at its global id. An events record is `field_bad` when its magic is wrong, its n
 * differs from the first record's, or its global id is not block * blockDim + thread for
 * the blockDim the records show. Exits 1 when the object does not load, a program does
 * not attach, or the poll function is missing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <bpf/bpf.h>

#include "../common/loader.h"
#include "gpu_maps.h"

#define MAX_LINKS 8
/* Global ids past this are records no launch of ours makes. */
#define MAX_GLOBAL_ID (1u << 20)

typedef int (*poll_fn)(int map_fd, void *ctx,
		       void (*cb)(const void *data, uint64_t size, void *ctx));

static const char usage[] =
	"Usage: gpu_maps [--obj FILE] [--verbose]\n"
	"Attaches gpu_maps.bpf.o's probes (default: beside us) until SIGINT/SIGTERM,\n"
	"reading its GPU ring buffer meanwhile, then prints what its maps hold.\n";

struct tally {
	uint64_t records, size_bad, field_bad;
	uint32_t n, block_dim;
	int have_n, have_block_dim;
	uint32_t *per_id;
};

/* A record of `size` bytes; `padded`: a perf buffer sample, whose size the kernel rounds
 * up so that it ends 8-aligned after its 4-byte size field (up to 7 more bytes). */
static void take_sized(struct tally *t, const void *data, uint64_t size, int padded)
{
	const struct gpu_maps_event *e = data;

	t->records++;
	if (padded ? size < sizeof(*e) || size >= sizeof(*e) + 8 : size != sizeof(*e)) {
		t->size_bad++;
		return;
	}
	if (!t->have_n) {
		t->n = e->n;
		t->have_n = 1;
	}
	if (!t->have_block_dim && e->block > 0 && e->global_id > e->thread) {
		t->block_dim = (e->global_id - e->thread) / e->block;
		t->have_block_dim = 1;
	}
	if (e->magic != GPU_MAPS_MAGIC || e->n != t->n || e->global_id >= MAX_GLOBAL_ID ||
	    e->global_id < e->thread ||
	    (e->block == 0 && e->global_id != e->thread) ||
	    (t->have_block_dim && e->block * t->block_dim + e->thread != e->global_id)) {
		t->field_bad++;
		return;
	}
	t->per_id[e->global_id]++;
}

static void on_polled(const void *data, uint64_t size, void *ctx)
{
	take_sized(ctx, data, size, 0);
}

static int on_ring_record(void *ctx, void *data, size_t size)
{
	take_sized(ctx, data, size, 0);
	return 0;
}

static void on_perf_sample(void *ctx, int cpu, void *data, __u32 size)
{
	(void)cpu;
	take_sized(ctx, data, size, 1);
}

static uint64_t perf_lost;

static void on_perf_lost(void *ctx, int cpu, __u64 count)
{
	(void)ctx;
	(void)cpu;
	perf_lost += count;
}

static uint64_t gpu_thread_count(void)
{
	const char *env = getenv("BPFTIME_MAP_GPU_THREAD_COUNT");

	if (env && *env)
		return strtoull(env, NULL, 10);
	return 1024;
}

static void print_ids(struct bpf_object *obj)
{
	struct bpf_map *map;

	bpf_object__for_each_map(map, obj) {
		struct bpf_map_info info = {};
		__u32 len = sizeof(info);

		if (bpf_obj_get_info_by_fd(bpf_map__fd(map), &info, &len) == 0)
			printf("map %s id=%u\n", bpf_map__name(map), info.id);
	}
}

static void print_per_thread(int fd)
{
	uint64_t threads = gpu_thread_count();
	uint64_t *calls = calloc(threads, sizeof(*calls));
	uint64_t *ids = calloc(threads, sizeof(*ids));
	uint64_t min = UINT64_MAX, max = 0, zero = 0, in_order = 0;
	__u32 key;

	if (!calls || !ids) {
		fprintf(stderr, "out of memory for %llu threads\n", (unsigned long long)threads);
		return;
	}
	key = PT_CALLS;
	if (bpf_map_lookup_elem(fd, &key, calls))
		fprintf(stderr, "per_thread lookup: %s\n", strerror(errno));
	key = PT_ID;
	if (bpf_map_lookup_elem(fd, &key, ids))
		fprintf(stderr, "per_thread lookup: %s\n", strerror(errno));
	for (uint64_t t = 0; t < threads; t++) {
		min = calls[t] < min ? calls[t] : min;
		max = calls[t] > max ? calls[t] : max;
		zero += calls[t] == 0;
		in_order += ids[t] == t + 1;
	}
	printf("per_thread threads=%llu calls_min=%llu calls_max=%llu calls_zero=%llu "
	       "ids_in_order=%llu\n",
	       (unsigned long long)threads, (unsigned long long)min, (unsigned long long)max,
	       (unsigned long long)zero, (unsigned long long)in_order);
	free(calls);
	free(ids);
}

static void print_totals(int fd)
{
	__u64 v[TOTAL_SLOTS] = {};

	for (__u32 k = 0; k < TOTAL_SLOTS; k++)
		bpf_map_lookup_elem(fd, &k, &v[k]);
	printf("totals entries=%llu elements=%llu exits=%llu refused=%llu\n",
	       (unsigned long long)v[TOTAL_ENTRIES], (unsigned long long)v[TOTAL_ELEMENTS],
	       (unsigned long long)v[TOTAL_EXITS], (unsigned long long)v[TOTAL_RECORDS_REFUSED]);
}

static void print_by_block(int fd)
{
	__u32 key, *prev = NULL;
	__u64 value, min = UINT64_MAX, max = 0, sum = 0, keys = 0;

	while (bpf_map_get_next_key(fd, prev, &key) == 0) {
		if (bpf_map_lookup_elem(fd, &key, &value) == 0) {
			keys++;
			sum += value;
			min = value < min ? value : min;
			max = value > max ? value : max;
		}
		prev = &key;
	}
	printf("by_block keys=%llu min=%llu max=%llu sum=%llu\n", (unsigned long long)keys,
	       (unsigned long long)(keys ? min : 0), (unsigned long long)max,
	       (unsigned long long)sum);
}

static void print_events(const struct tally *t, const char *reader, uint64_t poll_errors)
{
	uint64_t threads = 0, min = UINT64_MAX, max = 0;

	for (uint32_t id = 0; id < MAX_GLOBAL_ID; id++) {
		if (!t->per_id[id])
			continue;
		threads++;
		min = t->per_id[id] < min ? t->per_id[id] : min;
		max = t->per_id[id] > max ? t->per_id[id] : max;
	}
	printf("events reader=%s records=%llu size_bad=%llu field_bad=%llu threads=%llu "
	       "per_thread_min=%llu per_thread_max=%llu poll_errors=%llu\n",
	       reader, (unsigned long long)t->records, (unsigned long long)t->size_bad,
	       (unsigned long long)t->field_bad, (unsigned long long)threads,
	       (unsigned long long)(threads ? min : 0), (unsigned long long)max,
	       (unsigned long long)poll_errors);
}

int main(int argc, char **argv)
{
	const char *reader_env = getenv("GPU_MAPS_READER");
	int use_ringbuf = reader_env && !strcmp(reader_env, "ringbuf");
	int use_perf = reader_env && !strcmp(reader_env, "perf");
	struct perf_buffer *pb = NULL;
	struct loader_args args = {};
	struct bpf_link *links[MAX_LINKS];
	struct tally tally = {};
	struct ring_buffer *rb = NULL;
	char obj_path[PATH_MAX];
	struct bpf_program *prog;
	struct bpf_object *obj;
	uint64_t poll_errors = 0;
	poll_fn poll_ring = NULL;
	int n = 0, err = 0, events_fd, i;

	err = parse_args(argc, argv, &args, usage);
	if (err)
		return err > 0 ? 0 : 2;
	if (!args.obj) {
		if (default_obj_path("gpu_maps.bpf.o", obj_path, sizeof(obj_path)))
			return 1;
		args.obj = obj_path;
	}
	tally.per_id = calloc(MAX_GLOBAL_ID, sizeof(*tally.per_id));
	if (!tally.per_id)
		return 1;
	if (!use_ringbuf && !use_perf) {
		poll_ring = (poll_fn)dlsym(RTLD_DEFAULT, "bpftime_syscall_server__poll_gpu_ringbuf_map");
		if (!poll_ring) {
			puts("This loader reads bpftime's GPU ring buffer: run it under bpftime "
			     "(bpftime_syscall_server__poll_gpu_ringbuf_map is missing)");
			return 1;
		}
		printf("poll function found\n");
	}
	obj = open_and_load(args.obj);
	if (!obj)
		return 1;
	print_ids(obj);
	catch_exit_signals();
	bpf_object__for_each_program(prog, obj) {
		struct bpf_link *link;

		if (n == MAX_LINKS) {
			fprintf(stderr, "more than %d programs\n", MAX_LINKS);
			err = 1;
			break;
		}
		link = bpf_program__attach(prog);
		if (!link) {
			fprintf(stderr, "cannot attach program '%s' (%s): %s\n",
				bpf_program__name(prog), bpf_program__section_name(prog),
				strerror(errno));
			err = 1;
			break;
		}
		links[n++] = link;
	}
	events_fd = bpf_object__find_map_fd_by_name(obj, "events");
	if (!err && use_ringbuf) {
		rb = ring_buffer__new(events_fd, on_ring_record, &tally, NULL);
		if (!rb) {
			fprintf(stderr, "ring_buffer__new on events: %s\n", strerror(errno));
			err = 1;
		}
	}
	if (!err && use_perf) {
		/* 64 pages a CPU: a launch's 1024 records (40 bytes each in a perf buffer)
		 * several times over. */
		pb = perf_buffer__new(events_fd, 64, on_perf_sample, on_perf_lost, &tally, NULL);
		if (!pb) {
			fprintf(stderr, "perf_buffer__new on events: %s\n", strerror(errno));
			err = 1;
		}
	}
	if (!err) {
		announce_ready();
		while (!exit_requested) {
			if (rb) {
				if (ring_buffer__poll(rb, 20) < 0 && !exit_requested)
					poll_errors++;
			} else if (pb) {
				if (perf_buffer__poll(pb, 20) < 0 && !exit_requested)
					poll_errors++;
			} else {
				if (poll_ring(events_fd, &tally, on_polled) != 0)
					poll_errors++;
				usleep(20000);
			}
		}
		/* What arrived after the last look. */
		if (rb) {
			if (ring_buffer__consume(rb) < 0)
				poll_errors++;
		} else if (pb) {
			if (perf_buffer__consume(pb) < 0)
				poll_errors++;
		} else if (poll_ring(events_fd, &tally, on_polled) != 0) {
			poll_errors++;
		}
		print_per_thread(bpf_object__find_map_fd_by_name(obj, "per_thread"));
		print_totals(bpf_object__find_map_fd_by_name(obj, "totals"));
		print_by_block(bpf_object__find_map_fd_by_name(obj, "by_block"));
		print_events(&tally, rb ? "ringbuf" : pb ? "perf" : "poll", poll_errors);
		if (pb)
			printf("perf lost=%llu\n", (unsigned long long)perf_lost);
		fflush(stdout);
	}
	ring_buffer__free(rb);
	perf_buffer__free(pb);
	for (i = 0; i < n; i++)
		bpf_link__destroy(links[i]);
	bpf_object__close(obj);
	free(tally.per_id);
	return err;
}
