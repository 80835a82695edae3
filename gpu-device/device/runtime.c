/*
 * The device half of bpftime's GPU runtime: the helpers a probe spliced into a CUDA
 * kernel calls, on the device replicas of its maps (DESIGN.md item 5: map traffic stays
 * on the GPU; the host syncs the store with these replicas).
 *
 * Compiled by build.rs with clang-19 for nvptx64 into LLVM IR, which bpftime-jit-ptx
 * links into every probe before optimization (GpuEnv::library), so these functions
 * inline into the probe and become internal to it. No globals: every probe of a module
 * carries its own copy of this code, and everything a helper needs is reached through a
 * map descriptor (the value a probe's `lddw map` loads) or the per-context values that
 * `config()` functions answer, which the host fills in when it builds the library text.
 *
 * The layouts below are mirrored in src/device_maps.rs (`#[repr(C)]`); change both.
 */

typedef unsigned long long u64;
typedef long long s64;
typedef unsigned int u32;
typedef unsigned char u8;
/* Device memory (cuMemAlloc's): an atomic through such a pointer is `atom.global`, where a
 * generic one makes ptxas add a check for shared memory and a compare-and-swap loop for it
 * at every site. */
#ifdef BPFTIME_HOST_TEST
/* Built for the host by the table tests (tests/device_table.rs), threads standing in for
 * GPU threads: one address space. */
#define DEVICE_GLOBAL
#else
#define DEVICE_GLOBAL __attribute__((address_space(1)))
#endif
typedef DEVICE_GLOBAL u64 global_u64;
typedef DEVICE_GLOBAL u32 global_u32;

#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERF_EVENT_ARRAY 4
#define BPF_MAP_TYPE_PERCPU_HASH 5
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_LRU_HASH 9
#define BPF_MAP_TYPE_LRU_PERCPU_HASH 10
#define BPF_MAP_TYPE_RINGBUF 27
/* bpftime's GPU map types. The host describes 1501, 1503, 1504 and 1513 to the device as
 * the standard hash map and array they are served as, 1512 as 1502. */
#define BPF_MAP_TYPE_GPU_HASH 1501
#define BPF_MAP_TYPE_GPU_PER_THREAD_ARRAY 1502
#define BPF_MAP_TYPE_GPU_ARRAY 1503
#define BPF_MAP_TYPE_GPU_RINGBUF 1527

#define BPF_ANY 0
#define BPF_NOEXIST 1
#define BPF_EXIST 2

#define E2BIG 7
#define ENOENT 2
#define EEXIST 17
#define EINVAL 22
#define ENOSPC 28
#define EFAULT 14

/* Hash slot states. A slot goes EMPTY -> BUSY -> FULL (-> DELETED) and never back on
 * the device: every inserter of a key walks the same probe sequence and stops at the
 * first EMPTY slot, so concurrent inserts of one key meet there, one wins, and the others
 * wait for it to become FULL and find the key. The host rebuilds the table (tombstones
 * gone) when it pushes a change. */
#define SLOT_EMPTY 0u
#define SLOT_BUSY 1u
#define SLOT_FULL 2u
#define SLOT_DELETED 3u

/* A ring record's header: the length of the data, flags in the top bits, and the low 32
 * bits of the record's position, so that a header left from an earlier lap of the ring
 * never reads as committed. */
#define RECORD_DISCARD (1u << 31)
/* A trace record whose text is printed as it is, not as a format (bpftime's puts). */
#define RECORD_RAW (1u << 30)
#define RECORD_HEADER 8u

/* A ring is `shards` of these, one after the other, each with its own space: a thread
 * writes into the shard of its SM (sm % shards), so producers on different SMs never
 * contend for one head. One head for the whole GPU serialized them: a record cost about
 * 3.5 us of every other producer's time once many SMs wrote at once. A thread stays on
 * its SM, so its records stay in order. */
struct ring {
    u64 data;      /* device address of this shard's `size` bytes */
    u64 size;      /* a power of two */
    u64 head;      /* producers' position (bytes ever reserved) */
    u64 tail;      /* the host's position: bytes it has consumed */
    u64 dropped;   /* records refused for lack of space */
    u64 shards;    /* how many shards the ring has (the same in each) */
};

static struct ring *ring_shard(struct ring *r)
{
    /* The count is at most the SM count: a 32-bit remainder, where a 64-bit one is a
     * call of its own, whose registers every kernel that writes records pays for. */
    u32 n = (u32)r->shards;
    return n > 1 ? r + (u32)__nvvm_read_ptx_sreg_smid() % n : r;
}

struct gpu_map {
    u32 map_type;
    u32 key_size;
    u32 value_size;
    u32 max_entries;
    u32 key_stride;    /* round8(key_size) */
    u32 value_stride;  /* round8(value_size) */
    u32 copies;        /* values per key: 1, the SM count of a per-CPU map, or the thread
                        * count of a per-thread array */
    u32 capacity;      /* hash slots, a power of two */
    u64 values;        /* array: max_entries * copies values; hash: capacity * copies */
    u64 keys;          /* hash: capacity keys */
    u64 states;        /* hash: capacity u32 states */
    u64 count;         /* hash: the u32 number of FULL slots */
    u64 ring;          /* ringbuf and perf_event_array: a struct ring */
};

/* Per-SM shards of small arrays (DESIGN.md item 5: a GPU's SM is what a CPU is to
 * per-CPU maps). A non-fetching atomic add into a value of a sharded array goes to the
 * adding SM's copy of it (one region of copies for 8-byte adds, one for 4-byte adds); a
 * fold kernel, queued in the launch's stream right after each instrumented kernel, adds
 * the copies into the array and zeroes them, so every later reader (a later launch, the
 * host) sees the sums. Contention on one counter becomes contention on one counter per
 * SM, in different cache lines. Which arrays are sharded, and where their copies are,
 * the host writes into the library text as constants (device_maps.rs, `library_ir`):
 * `bpftime_gpu_shard_address(addr, wide, sm)` answers where an add of 8 (`wide`) or 4
 * bytes at `addr` from SM `sm` goes, `addr` itself when it is in no sharded array. */
extern u64 bpftime_gpu_shard_address(u64 addr, u64 wide, u64 sm);

/* Every atomic here is relaxed, with explicit fences where order matters: LLVM 19's
 * NVPTX backend selects relaxed atomics everywhere, and aborts the process on some
 * ordered ones (an atomic store with release ordering, for one). */

/* Per-context values the host writes into the library text before compiling. */
extern u64 bpftime_gpu_config_pid_tgid(void);
extern u64 bpftime_gpu_config_trace_ring(void);

static inline u32 sm_id(void) { return __nvvm_read_ptx_sreg_smid(); }

static inline u64 volatile_load64(const u64 *p) { return *(const volatile u64 *)p; }
static inline u32 volatile_load32(const u32 *p) { return *(const volatile u32 *)p; }

/* How long a thread waits for a slot another thread is filling: the filler may be a
 * lane of the same warp, which runs only when the waiter yields (nanosleep), and a probe
 * must never hang a kernel, so the wait is bounded; past it, the slot is passed over. */
#define BUSY_WAITS 100000

static u32 wait_while_busy(const u32 *state)
{
    u32 s = volatile_load32(state);
    for (u32 n = 0; s == SLOT_BUSY && n < BUSY_WAITS; n++) {
        __nvvm_nanosleep(64);
        s = volatile_load32(state);
    }
    return s;
}

/* Not unrolled: what it copies is short (a record, a key, a value), and unrolled it made
 * every kernel a probe's out-of-line writers are spliced into longer for the driver's
 * JIT (memtrace in vectorAdd: 48 instructions of 752). */
static void copy_bytes(u8 *dst, const u8 *src, u64 n)
{
    if ((((u64)dst | (u64)src | n) & 7) == 0) {
#pragma clang loop unroll(disable)
        for (u64 i = 0; i < n; i += 8)
            *(u64 *)(dst + i) = *(const u64 *)(src + i);
        return;
    }
#pragma clang loop unroll(disable)
    for (u64 i = 0; i < n; i++)
        dst[i] = src[i];
}

static int equal_bytes(const u8 *a, const u8 *b, u32 n)
{
    for (u32 i = 0; i < n; i++)
        if (a[i] != b[i])
            return 0;
    return 1;
}

/* FNV-1a over the key; src/device_maps.rs computes the same when it rebuilds a table. */
static u32 hash_key(const u8 *key, u32 n)
{
    u32 h = 2166136261u;
    for (u32 i = 0; i < n; i++) {
        h ^= key[i];
        h *= 16777619u;
    }
    return h;
}

static u32 copy_index(const struct gpu_map *m)
{
    return m->copies > 1 ? sm_id() % m->copies : 0;
}

/* The thread's global id as bpftime numbers the copies of a per-thread array (its
 * `getGlobalThreadId`): the thread's coordinates in the whole grid, x fastest, z slowest;
 * `blockIdx.x * blockDim.x + threadIdx.x` in a one-dimensional launch. */
static u64 global_thread_id(void)
{
    u64 dx = __nvvm_read_ptx_sreg_ntid_x(), dy = __nvvm_read_ptx_sreg_ntid_y();
    u64 x = (u64)__nvvm_read_ptx_sreg_ctaid_x() * dx + __nvvm_read_ptx_sreg_tid_x();
    u64 y = (u64)__nvvm_read_ptx_sreg_ctaid_y() * dy + __nvvm_read_ptx_sreg_tid_y();
    u64 z = (u64)__nvvm_read_ptx_sreg_ctaid_z() * __nvvm_read_ptx_sreg_ntid_z() +
            __nvvm_read_ptx_sreg_tid_z();
    u64 width = (u64)__nvvm_read_ptx_sreg_nctaid_x() * dx;
    u64 height = (u64)__nvvm_read_ptx_sreg_nctaid_y() * dy;
    return (z * height + y) * width + x;
}

/* A per-thread array keeps `copies` values per key, the thread of global id t using
 * copy t: no two threads share a value, so a probe updates its own without atomics. A
 * thread past the map's thread count has none (bpftime would write past the map). */
static u8 *array_value(const struct gpu_map *m, const u8 *key)
{
    u32 index = *(const u32 *)key;
    if (index >= m->max_entries)
        return 0;
    u64 copy;
    if (m->map_type == BPF_MAP_TYPE_GPU_PER_THREAD_ARRAY) {
        copy = global_thread_id();
        if (copy >= m->copies)
            return 0;
    } else {
        copy = copy_index(m);
    }
    u64 at = ((u64)index * m->copies + copy) * m->value_stride;
    return (u8 *)m->values + at;
}

/* The slot holding `key`, or -1; stops at the first EMPTY slot of its sequence. */
static s64 hash_find(const struct gpu_map *m, const u8 *key)
{
    u32 *states = (u32 *)m->states;
    u32 mask = m->capacity - 1;
    u32 at = hash_key(key, m->key_size) & mask;
    for (u32 n = 0; n < m->capacity; n++, at = (at + 1) & mask) {
        u32 state = wait_while_busy(&states[at]);
        if (state == SLOT_EMPTY)
            return -1;
        if (state == SLOT_FULL &&
            equal_bytes((const u8 *)m->keys + (u64)at * m->key_stride, key, m->key_size))
            return at;
    }
    return -1;
}

static u8 *hash_value(const struct gpu_map *m, u32 slot)
{
    return (u8 *)m->values + ((u64)slot * m->copies + copy_index(m)) * m->value_stride;
}

static int is_hash(u32 t)
{
    return t == BPF_MAP_TYPE_HASH || t == BPF_MAP_TYPE_PERCPU_HASH ||
           t == BPF_MAP_TYPE_GPU_HASH || t == BPF_MAP_TYPE_LRU_HASH ||
           t == BPF_MAP_TYPE_LRU_PERCPU_HASH;
}

/* LRU hash maps, plain and per-CPU: when full, an insert evicts an entry not used lately, as the kernel's
 * LRU maps do (approximately, as theirs). Their states array is followed by a reference
 * flag per slot (set by a lookup or update that finds the slot, and by the insert that
 * fills it) and by the clock's hand (device_maps.rs, `lru_extra_bytes`): the hand passes
 * over slots, clearing the flags it finds set, and evicts the first full slot whose flag
 * is clear, so an entry used since the hand last passed is kept. */
static int is_lru(const struct gpu_map *m)
{
    return m->map_type == BPF_MAP_TYPE_LRU_HASH || m->map_type == BPF_MAP_TYPE_LRU_PERCPU_HASH;
}

static u32 *lru_refs(const struct gpu_map *m)
{
    return (u32 *)m->states + m->capacity;
}

static u32 *lru_hand(const struct gpu_map *m)
{
    return (u32 *)m->states + 2 * (u64)m->capacity;
}

/* Read first: a flag already set is not written again, which keeps lookups of a hot
 * key from writing its cache line from every thread. */
static void lru_touch(const struct gpu_map *m, u32 slot)
{
    if (!is_lru(m))
        return;
    u32 *ref = &lru_refs(m)[slot];
    if (volatile_load32(ref) == 0)
        *(volatile u32 *)ref = 1;
}

/* The clock: the hand passes over slots, clearing the reference flags it finds set, and
 * moves the first full slot whose flag is clear to state `to`. That slot, or -1 when the
 * hand found none to take in two turns of the table. */
static s64 lru_victim(const struct gpu_map *m, u32 to)
{
    u32 *states = (u32 *)m->states;
    u32 *refs = lru_refs(m);
    u32 mask = m->capacity - 1;
    for (u64 n = 0; n < 2 * (u64)m->capacity; n++) {
        u32 at = __atomic_fetch_add(lru_hand(m), 1, __ATOMIC_RELAXED) & mask;
        if (volatile_load32(&states[at]) != SLOT_FULL)
            continue;
        if (volatile_load32(&refs[at]) != 0) {
            *(volatile u32 *)&refs[at] = 0;
            continue;
        }
        u32 expected = SLOT_FULL;
        if (__atomic_compare_exchange_n(&states[at], &expected, to, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            return at;
    }
    return -1;
}

/* Evicts one entry (it becomes DELETED, as a delete makes it); 0 when there was none to
 * take. */
static int lru_evict(const struct gpu_map *m)
{
    if (lru_victim(m, SLOT_DELETED) < 0)
        return 0;
    __atomic_fetch_sub((u32 *)m->count, 1, __ATOMIC_RELAXED);
    return 1;
}

/* Counts one more entry, for a slot the caller has already claimed, if the map has room
 * for it. A full LRU map makes the room by evicting; when the hand finds nothing to
 * evict (every other entry was just inserted or used), the entry is counted anyway and
 * the map holds one more than max_entries until later inserts evict it back down: an
 * LRU update must not fail for room. Only claimers count, so a crowd of threads racing
 * to insert one key cannot push the count past max_entries and evict live entries. */
static int reserve_entry(const struct gpu_map *m)
{
    u32 *count = (u32 *)m->count;
    u32 before = __atomic_fetch_add(count, 1, __ATOMIC_RELAXED);
    if (before < m->max_entries)
        return 1;
    if (is_lru(m)) {
        lru_evict(m);
        /* Over max_entries already: one more eviction brings the count back down. */
        if (before > m->max_entries)
            lru_evict(m);
        return 1;
    }
    __atomic_fetch_sub(count, 1, __ATOMIC_RELAXED);
    return 0;
}

static int is_array(u32 t)
{
    return t == BPF_MAP_TYPE_ARRAY || t == BPF_MAP_TYPE_PERCPU_ARRAY || t == BPF_MAP_TYPE_GPU_ARRAY ||
           t == BPF_MAP_TYPE_GPU_PER_THREAD_ARRAY;
}

#ifndef BPFTIME_TABLE_ONLY
u64 bpftime_gpu_map_lookup_elem(u64 map, u64 key, u64 r3, u64 r4, u64 r5)
{
    const struct gpu_map *m = (const struct gpu_map *)map;
    if (is_array(m->map_type))
        return (u64)array_value(m, (const u8 *)key);
    if (is_hash(m->map_type)) {
        s64 slot = hash_find(m, (const u8 *)key);
        if (slot < 0)
            return 0;
        lru_touch(m, (u32)slot);
        return (u64)hash_value(m, (u32)slot);
    }
    return 0;
}
#endif

/* Writes `key` into slot `at`, which the caller holds BUSY, with every copy of its value
 * zeroed and, in an LRU map, its reference flag set. */
static void fill_slot(const struct gpu_map *m, u32 at, const u8 *key)
{
    copy_bytes((u8 *)m->keys + (u64)at * m->key_stride, key, m->key_size);
    u8 *values = (u8 *)m->values + (u64)at * m->copies * m->value_stride;
    for (u64 i = 0; i < (u64)m->copies * m->value_stride; i += 8)
        *(u64 *)(values + i) = 0;
    if (is_lru(m))
        *(volatile u32 *)&lru_refs(m)[at] = 1;
}

/* Takes slot `at` from state `from` for `key`, and counts it: its key written, every copy
 * of its value zeroed; the caller publishes it. 0 if another thread took it first; -1 if
 * the map has no room (the slot is given back as it was). The slot is claimed before it
 * is counted: threads racing to insert one key all reserving first would count many
 * entries for the one that gets in. */
static int claim_slot(const struct gpu_map *m, u32 at, u32 from, const u8 *key)
{
    u32 *state = &((u32 *)m->states)[at];
    u32 expected = from;
    if (!__atomic_compare_exchange_n(state, &expected, SLOT_BUSY, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED))
        return 0;
    if (!reserve_entry(m)) {
        __nvvm_membar_gl();
        *(volatile u32 *)state = from;
        return -1;
    }
    fill_slot(m, at, key);
    return 1;
}

/* How many times an LRU insert into a table without empty slots looks for a deleted slot
 * and for an entry to replace before it fails. A million threads inserting at once into a
 * map of a thousand entries can each lose the race for every victim the hand offers for a
 * while (16 tries without waiting failed one insert in 40 million on an H200); between
 * tries the thread waits, longer each time, so the winners publish. The bound is in tries,
 * not time: each try is bounded work, and under such a crowd one insert may take longer
 * than a millisecond (a 2 ms limit failed 1.5% of the updates of a full map). */
#define LRU_INSERT_TRIES 256
#define LRU_WAIT_MAX_NS 8192u

/* Replaces an entry not used lately with `key`: its slot goes from FULL to BUSY in one
 * step, so no other thread can take the room in between, and the count stays as it was.
 * The slot, or -1 when the hand found none to take. */
static s64 lru_take(const struct gpu_map *m, const u8 *key)
{
    s64 at = lru_victim(m, SLOT_BUSY);
    if (at >= 0)
        fill_slot(m, (u32)at, key);
    return at;
}

/* Inserts `key` with every copy of its value zeroed (the kernel's per-CPU semantics for
 * copies other than this SM's), or finds it if another thread got there first. Returns
 * the slot, -E2BIG when full, or -EEXIST (slot in *found) when the key exists. */
static s64 hash_insert(const struct gpu_map *m, const u8 *key, s64 *found)
{
    u32 *states = (u32 *)m->states;
    u32 mask = m->capacity - 1;
    u32 at = hash_key(key, m->key_size) & mask;
    s64 deleted = -1;
    for (u32 n = 0; n < m->capacity; n++, at = (at + 1) & mask) {
        u32 state = volatile_load32(&states[at]);
        if (state == SLOT_EMPTY) {
            int claimed = claim_slot(m, at, SLOT_EMPTY, key);
            if (claimed > 0)
                return at;
            if (claimed < 0)
                return -E2BIG;
        }
        state = wait_while_busy(&states[at]);
        if (state == SLOT_FULL &&
            equal_bytes((const u8 *)m->keys + (u64)at * m->key_stride, key, m->key_size)) {
            *found = at;
            return -EEXIST;
        }
        if (state == SLOT_DELETED && deleted < 0)
            deleted = at;
    }
    /* No empty slot is left: evictions (and deletes) of this launch used them all, and
     * the host makes the table anew between launches (replica.rs), so none comes back
     * within the launch and a key may go in any slot (lookups walk the whole table). An
     * LRU map, whose inserts must not fail for room, then takes a deleted slot, or, when
     * thousands of threads inserting at once leave none unclaimed, an entry not used
     * lately in place. Two threads inserting one key at once here may each take a slot,
     * and the host keeps one of the two. */
    if (!is_lru(m))
        return -E2BIG;
    u32 wait_ns = 64;
    for (u32 tries = 0; tries < LRU_INSERT_TRIES; tries++) {
        /* Deleted slots come and go while the crowd inserts (each insert into one evicts
         * another); only a walk that met one looks for them again. */
        for (u32 n = 0; deleted >= 0 && n < m->capacity; n++, deleted = (deleted + 1) & mask) {
            if (volatile_load32(&states[deleted]) != SLOT_DELETED)
                continue;
            int claimed = claim_slot(m, (u32)deleted, SLOT_DELETED, key);
            if (claimed > 0)
                return deleted;
            if (claimed < 0)
                return -E2BIG;
        }
        s64 taken = lru_take(m, key);
        if (taken >= 0)
            return taken;
        __nvvm_nanosleep(wait_ns);
        if (wait_ns < LRU_WAIT_MAX_NS)
            wait_ns *= 2;
    }
    return -E2BIG;
}

/* A fence, then a plain volatile store: LLVM 19's NVPTX backend cannot select an
 * atomic store with release ordering (it aborts), and the fence gives the same order. */
static void publish_slot(const struct gpu_map *m, u32 slot)
{
    __nvvm_membar_gl();
    *(volatile u32 *)&((u32 *)m->states)[slot] = SLOT_FULL;
}

/* Removes `key`: 0, or -ENOENT. */
static s64 hash_delete(const struct gpu_map *m, const u8 *key)
{
    s64 slot = hash_find(m, key);
    if (slot < 0)
        return -ENOENT;
    u32 expected = SLOT_FULL;
    if (!__atomic_compare_exchange_n(&((u32 *)m->states)[slot], &expected, SLOT_DELETED, 0,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return -ENOENT;
    __atomic_fetch_sub((u32 *)m->count, 1, __ATOMIC_RELAXED);
    return 0;
}

/* Everything below is what probes call; device/hash_ops.c takes the table code above. */
#ifndef BPFTIME_TABLE_ONLY

u64 bpftime_gpu_map_update_elem(u64 map, u64 key, u64 value, u64 flags, u64 r5)
{
    const struct gpu_map *m = (const struct gpu_map *)map;
    if (flags > BPF_EXIST)
        return (u64)-EINVAL;
    if (is_array(m->map_type)) {
        u8 *slot = array_value(m, (const u8 *)key);
        if (!slot)
            return (u64)-E2BIG;
        if (flags == BPF_NOEXIST)
            return (u64)-EEXIST;
        copy_bytes(slot, (const u8 *)value, m->value_size);
        return 0;
    }
    if (!is_hash(m->map_type))
        return (u64)-EINVAL;
    s64 slot = hash_find(m, (const u8 *)key);
    if (slot >= 0) {
        if (flags == BPF_NOEXIST)
            return (u64)-EEXIST;
        copy_bytes(hash_value(m, (u32)slot), (const u8 *)value, m->value_size);
        lru_touch(m, (u32)slot);
        return 0;
    }
    if (flags == BPF_EXIST)
        return (u64)-ENOENT;
    s64 found = -1;
    slot = hash_insert(m, (const u8 *)key, &found);
    if (slot == -EEXIST) {
        if (flags == BPF_NOEXIST)
            return (u64)-EEXIST;
        copy_bytes(hash_value(m, (u32)found), (const u8 *)value, m->value_size);
        lru_touch(m, (u32)found);
        return 0;
    }
    if (slot < 0)
        return (u64)slot;
    copy_bytes(hash_value(m, (u32)slot), (const u8 *)value, m->value_size);
    publish_slot(m, (u32)slot);
    return 0;
}

u64 bpftime_gpu_map_delete_elem(u64 map, u64 key, u64 r3, u64 r4, u64 r5)
{
    const struct gpu_map *m = (const struct gpu_map *)map;
    if (is_array(m->map_type))
        return (u64)-EINVAL;
    if (!is_hash(m->map_type))
        return (u64)-EINVAL;
    return (u64)hash_delete(m, (const u8 *)key);
}

/* 1 when bpftime-jit-ptx proves `x` the same in every lane of a warp (a constant, the
 * call site's constants, a kernel argument, arithmetic on those), else 0: it answers
 * every call when it compiles a probe (`fold_uniform_warp_ops`), so none is left to
 * run. */
extern int bpftime_gpu_known_uniform(u64 x) __attribute__((const));

/* An atomic add that many threads make to one address (a counter on every thread), as
 * bpftime-jit-ptx routes the programs' non-fetching atomic adds here. Made of values
 * every lane holds alike (a counter's add of a constant to a constant address, or to one
 * made of the call site's constants), one active lane adds for all of them, whichever
 * lanes are active, with no match. A value every lane holds alike added to addresses
 * that differ (a histogram's slot): the lanes with the same address are matched and one
 * of each group adds for its group. Otherwise, when a whole warp adds to the same
 * address, its values are summed across the warp and one lane makes the one atomic; else
 * each lane adds its own. Always inlined, so that a uniform value or address lets the
 * match and the shuffles fold away. */

/* Where this thread's add of 8 (`wide`) or 4 bytes at `addr` goes (its SM's copy, or
 * `addr`), worked out in every lane before the lanes that add are picked: left to LLVM,
 * the arithmetic would sink into the branch of the lanes that add, and ptxas redo it in
 * each branch, where worked out in line it shares the SM's part with every other add of
 * the kernel (bpftime's splice reads the SM's id once per thread). */
static u64 shard_address_here(u64 addr, u64 wide)
{
    u64 at = bpftime_gpu_shard_address(addr, wide, sm_id());
#ifndef BPFTIME_HOST_TEST
    __asm__ volatile("" : "+l"(at));
#endif
    return at;
}

/* Whether this lane is the highest in `lanes` (which holds it): `bfind`, the GPU's
 * find-leading-one, is one instruction where the lowest lane (a count of trailing zeros)
 * takes three. */
static int leads(unsigned lanes)
{
    unsigned highest;
#ifdef BPFTIME_HOST_TEST
    highest = 31 - (unsigned)__builtin_clz(lanes);
#else
    __asm__("bfind.u32 %0, %1;" : "=r"(highest) : "r"(lanes));
#endif
    return __nvvm_read_ptx_sreg_laneid() == highest;
}

/* Where every lane adds the same value: the active lanes in `mask` that add to this
 * lane's `addr`, all of them for an address known alike in every lane, else those one
 * `match.any` groups with it. */
__attribute__((always_inline)) static unsigned lanes_adding_here(unsigned mask, u64 addr)
{
    return bpftime_gpu_known_uniform(addr) ? mask : __nvvm_match_any_sync_i64(mask, addr);
}

/* The add itself, whose old value nobody reads: a reduction (`red`), which the memory
 * system carries out without sending anything back. Written as an atomic whose result is
 * unused, ptxas keeps it an atomic with a reply (`ATOMG`), as LLVM writes every atomic
 * add as `atom`. Relaxed, at the GPU's scope, as the atomic it stands for. */
static void add_to_global_u64(u64 at, u64 v)
{
#ifdef BPFTIME_HOST_TEST
    __atomic_fetch_add((global_u64 *)at, v, __ATOMIC_RELAXED);
#else
    __asm__ volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(at), "l"(v) : "memory");
#endif
}

static void add_to_global_u32(u64 at, u32 v)
{
#ifdef BPFTIME_HOST_TEST
    __atomic_fetch_add((global_u32 *)at, v, __ATOMIC_RELAXED);
#else
    __asm__ volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(at), "r"(v) : "memory");
#endif
}

__attribute__((always_inline))
u64 bpftime_gpu_warp_add_u64(u64 addr, u64 v, u64 r3, u64 r4, u64 r5)
{
    /* A thread's stack: the same address in every lane names 32 different slots. */
    if (__nvvm_isspacep_local((void *)addr)) {
        *(u64 *)addr += v;
        return 0;
    }
    unsigned mask = __nvvm_activemask(), count = 1;
    int leader = 1;
    if (bpftime_gpu_known_uniform(v)) {
        unsigned lanes = lanes_adding_here(mask, addr);
        leader = leads(lanes);
        count = (unsigned)__builtin_popcount(lanes);
    } else if (mask == 0xffffffffu && __nvvm_match_any_sync_i64(mask, addr) == mask) {
        for (int off = 16; off > 0; off >>= 1) {
            unsigned lo = __nvvm_shfl_sync_bfly_i32(mask, (unsigned)v, off, 0x1f);
            unsigned hi = __nvvm_shfl_sync_bfly_i32(mask, (unsigned)(v >> 32), off, 0x1f);
            v += ((u64)hi << 32) | lo;
        }
        leader = __nvvm_read_ptx_sreg_laneid() == 0;
    }
    /* Not the stack (above): a map's value or its SM's copy, in device memory. */
    u64 at = shard_address_here(addr, 1);
    if (leader)
        add_to_global_u64(at, v * count);
    return 0;
}

__attribute__((always_inline))
u64 bpftime_gpu_warp_add_u32(u64 addr, u64 v, u64 r3, u64 r4, u64 r5)
{
    if (__nvvm_isspacep_local((void *)addr)) {
        *(u32 *)addr += (u32)v;
        return 0;
    }
    unsigned mask = __nvvm_activemask(), count = 1;
    int leader = 1;
    u32 sum = (u32)v;
    if (bpftime_gpu_known_uniform(v)) {
        unsigned lanes = lanes_adding_here(mask, addr);
        leader = leads(lanes);
        count = (unsigned)__builtin_popcount(lanes);
    } else if (mask == 0xffffffffu && __nvvm_match_any_sync_i64(mask, addr) == mask) {
        for (int off = 16; off > 0; off >>= 1)
            sum += __nvvm_shfl_sync_bfly_i32(mask, sum, off, 0x1f);
        leader = __nvvm_read_ptx_sreg_laneid() == 0;
    }
    u64 at = shard_address_here(addr, 0);
    if (leader)
        add_to_global_u32(at, sum * count);
    return 0;
}

/* Reserves `len` bytes of record data; returns the data address or 0 (dropped). */
/* Reserves in `r`, a shard (see ring_shard). */
static u8 *ring_reserve(struct ring *r, u32 len, u64 *pos_out)
{
    u64 total = (RECORD_HEADER + (u64)len + 7) & ~7ull;
    if (total > r->size / 2) {
        __atomic_fetch_add(&r->dropped, 1, __ATOMIC_RELAXED);
        return 0;
    }
    u64 head = volatile_load64(&r->head);
    for (;;) {
        u64 tail = volatile_load64(&r->tail);
        if (tail > head) {
            /* Our head is older than the host's tail: the host read records reserved
             * after we looked. The ring is not full; look again. */
            head = volatile_load64(&r->head);
            continue;
        }
        if (head + total - tail > r->size) {
            __atomic_fetch_add(&r->dropped, 1, __ATOMIC_RELAXED);
            return 0;
        }
        /* A record never wraps: pad to the end of the ring with a discarded record. */
        u64 offset = head & (r->size - 1);
        u64 room = r->size - offset;
        u64 take = room < total ? room + total : total;
        if (head + take - tail > r->size) {
            __atomic_fetch_add(&r->dropped, 1, __ATOMIC_RELAXED);
            return 0;
        }
        if (__atomic_compare_exchange_n(&r->head, &head, head + take, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            u8 *data = (u8 *)r->data;
            if (take != total) {
                u32 *pad = (u32 *)(data + offset);
                pad[1] = (u32)head;
                __nvvm_membar_gl();
                *(volatile u32 *)pad = (u32)(room - RECORD_HEADER) | RECORD_DISCARD;
                head += room;
                offset = 0;
            }
            *pos_out = head;
            return data + offset + RECORD_HEADER;
        }
    }
}

static void ring_commit(struct ring *r, u64 pos, u32 len, u32 flags)
{
    u32 *header = (u32 *)((u8 *)r->data + (pos & (r->size - 1)));
    header[1] = (u32)pos;
    __nvvm_membar_gl();
    *(volatile u32 *)header = len | flags;
}

static u64 ring_output(struct ring *r, const u8 *data, u64 size)
{
    if (size == 0 || size > 0x7fffffffull)
        return (u64)-EINVAL;
    u64 pos;
    u8 *to = ring_reserve(r, (u32)size, &pos);
    if (!to)
        return (u64)-ENOSPC;
    copy_bytes(to, data, size);
    ring_commit(r, pos, (u32)size, 0);
    return 0;
}

/* A record of up to 128 bytes handed to an output helper reaches the helper's
 * out-of-line writer as words in registers, copied where the program calls (the helper
 * is inlined there). The program's stack address handed to a call that is not inlined
 * would keep every store the program makes to its stack, on every path (memtrace's keys
 * of its counters, stored for lookups that inline to nothing), and a copy in a buffer of
 * the helper's would keep the address of a stack frame, worked out at every access a
 * probe sits at whether it writes a record or not: copied into words, what the program
 * stored is read where the record is written, and the rest stays in registers. Records
 * of up to 32 bytes (most events) pass 4 words, larger ones 16: every word is a register
 * at the call, and a kernel needs as many registers as its busiest point. */
#define SMALL_WORDS 4
#define LARGE_WORDS 16
#define SMALL_PARAMS u64 w0, u64 w1, u64 w2, u64 w3
#define SMALL_LIST w0, w1, w2, w3
#define LARGE_PARAMS                                                                       \
    SMALL_PARAMS, u64 w4, u64 w5, u64 w6, u64 w7, u64 w8, u64 w9, u64 w10, u64 w11,      \
        u64 w12, u64 w13, u64 w14, u64 w15
#define LARGE_LIST SMALL_LIST, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15
#define SMALL_OF(w) (w)[0], (w)[1], (w)[2], (w)[3]
#define LARGE_OF(w)                                                                        \
    SMALL_OF(w), (w)[4], (w)[5], (w)[6], (w)[7], (w)[8], (w)[9], (w)[10], (w)[11],       \
        (w)[12], (w)[13], (w)[14], (w)[15]

/* `CALL(words)` with the record at `data` of `size` bytes as words where it fits in 16
 * (CALL_SMALL or CALL_LARGE's `w`), else CALL_WHOLE with its address. */
#define OUTPUT_IN_WORDS(data, size, CALL_SMALL, CALL_LARGE, CALL_WHOLE)                    \
    do {                                                                                   \
        u64 w[LARGE_WORDS];                                                                \
        if ((size) <= SMALL_WORDS * 8) {                                                   \
            __builtin_memcpy(w, (const void *)(data), (size));                             \
            return CALL_SMALL;                                                             \
        }                                                                                  \
        if ((size) <= LARGE_WORDS * 8) {                                                   \
            __builtin_memcpy(w, (const void *)(data), (size));                             \
            return CALL_LARGE;                                                             \
        }                                                                                  \
        return CALL_WHOLE;                                                                 \
    } while (0)

/* A GPU ring buffer's records are at most its value_size bytes (bpftime's slot). */
static u64 gpu_ring_output(const struct gpu_map *m, u64 data, u64 size)
{
    if (size > m->value_size)
        return (u64)-E2BIG;
    return ring_output(ring_shard((struct ring *)m->ring), (const u8 *)data, size);
}

static __attribute__((noinline)) u64 ringbuf_output(u64 map, u64 data, u64 size)
{
    const struct gpu_map *m = (const struct gpu_map *)map;
    if (m->map_type == BPF_MAP_TYPE_GPU_RINGBUF)
        return gpu_ring_output(m, data, size);
    if (m->map_type != BPF_MAP_TYPE_RINGBUF)
        return (u64)-EINVAL;
    return ring_output(ring_shard((struct ring *)m->ring), (const u8 *)data, size);
}

static __attribute__((noinline)) u64 ringbuf_output_small(u64 map, u64 size, SMALL_PARAMS)
{
    u64 w[SMALL_WORDS] = {SMALL_LIST};
    return ringbuf_output(map, (u64)w, size);
}

static __attribute__((noinline)) u64 ringbuf_output_large(u64 map, u64 size, LARGE_PARAMS)
{
    u64 w[LARGE_WORDS] = {LARGE_LIST};
    return ringbuf_output(map, (u64)w, size);
}

__attribute__((always_inline))
u64 bpftime_gpu_ringbuf_output(u64 map, u64 data, u64 size, u64 flags, u64 r5)
{
    OUTPUT_IN_WORDS(data, size, ringbuf_output_small(map, size, SMALL_OF(w)),
                    ringbuf_output_large(map, size, LARGE_OF(w)),
                    ringbuf_output(map, data, size));
}

/* A perf record goes into the map's ring with the perf event flags (the CPU index) in
 * front of it; the host writes it to the store's perf buffer of that CPU. */
static __attribute__((noinline)) u64 perf_event_output(u64 map, u64 flags, u64 data, u64 size);

static __attribute__((noinline)) u64 perf_event_output_small(u64 map, u64 flags, u64 size,
                                                             SMALL_PARAMS)
{
    u64 w[SMALL_WORDS] = {SMALL_LIST};
    return perf_event_output(map, flags, (u64)w, size);
}

static __attribute__((noinline)) u64 perf_event_output_large(u64 map, u64 flags, u64 size,
                                                             LARGE_PARAMS)
{
    u64 w[LARGE_WORDS] = {LARGE_LIST};
    return perf_event_output(map, flags, (u64)w, size);
}

__attribute__((always_inline))
u64 bpftime_gpu_perf_event_output(u64 ctx, u64 map, u64 flags, u64 data, u64 size)
{
    OUTPUT_IN_WORDS(data, size, perf_event_output_small(map, flags, size, SMALL_OF(w)),
                    perf_event_output_large(map, flags, size, LARGE_OF(w)),
                    perf_event_output(map, flags, data, size));
}

/* On a GPU ring buffer (bpftime's way to write one) the record goes as it is, without
 * the flags, which mean nothing there: the host hands it on with its size. */
static __attribute__((noinline)) u64 perf_event_output(u64 map, u64 flags, u64 data, u64 size)
{
    const struct gpu_map *m = (const struct gpu_map *)map;
    if (m->map_type == BPF_MAP_TYPE_GPU_RINGBUF)
        return gpu_ring_output(m, data, size);
    if (m->map_type != BPF_MAP_TYPE_PERF_EVENT_ARRAY || size == 0 || size > 0x7fff0000ull)
        return (u64)-EINVAL;
    struct ring *r = ring_shard((struct ring *)m->ring);
    u64 pos;
    u8 *to = ring_reserve(r, (u32)size + 8, &pos);
    if (!to)
        return (u64)-ENOSPC;
    *(u64 *)to = flags;
    copy_bytes(to + 8, (const u8 *)data, size);
    ring_commit(r, pos, (u32)size + 8, 0);
    return 0;
}

/* A trace record: three u64 arguments, the global timer when it was written (the host
 * turns it into CLOCK_MONOTONIC with the context's calibration, the offset that
 * bpf_ktime_get_ns adds), the SM and the block's linear index, the grid's launch number in
 * its context (%gridid: the driver numbers a context's launches in the order they were
 * submitted, so the host can tell which launch wrote a line when two kernels run at once),
 * then the text. Mirrored by `TRACE_HEAD` in src/session.rs. */
#define TRACE_HEAD 48u

static void trace_stamp(u8 *to)
{
    u64 *words = (u64 *)to;
    words[3] = __nvvm_read_ptx_sreg_globaltimer();
    u32 *where = (u32 *)(to + 32);
    where[0] = __nvvm_read_ptx_sreg_smid();
    where[1] = __nvvm_read_ptx_sreg_ctaid_x() +
               __nvvm_read_ptx_sreg_nctaid_x() *
                   (__nvvm_read_ptx_sreg_ctaid_y() +
                    __nvvm_read_ptx_sreg_nctaid_y() * __nvvm_read_ptx_sreg_ctaid_z());
    /* clang's builtin reads it as 32 bits; the register is 64. */
    u64 grid;
    __asm__ volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    words[5] = grid;
}

/* bpf_trace_printk: the format (up to 256 bytes) and three arguments go into the
 * context's trace ring, formatted on the host: a GPU thread never waits for the host. */
u64 bpftime_gpu_trace_printk(u64 fmt, u64 fmt_size, u64 a, u64 b, u64 c)
{
    struct ring *r = ring_shard((struct ring *)bpftime_gpu_config_trace_ring());
    if (!r)
        return (u64)-EINVAL;
    if (fmt_size == 0 || fmt_size > 256)
        return (u64)-EINVAL;
    u64 pos;
    u32 len = TRACE_HEAD + (u32)fmt_size;
    u8 *to = ring_reserve(r, len, &pos);
    if (!to)
        return (u64)-ENOSPC;
    u64 *args = (u64 *)to;
    args[0] = a;
    args[1] = b;
    args[2] = c;
    trace_stamp(to);
    copy_bytes(to + TRACE_HEAD, (const u8 *)fmt, fmt_size);
    ring_commit(r, pos, len, 0);
    return fmt_size;
}

/* bpftime's helper 501: a NUL-terminated string, printed like trace_printk("%s"). */
u64 bpftime_gpu_puts(u64 str, u64 r2, u64 r3, u64 r4, u64 r5)
{
    const u8 *s = (const u8 *)str;
    u64 n = 0;
    while (n < 255 && s[n])
        n++;
    struct ring *r = ring_shard((struct ring *)bpftime_gpu_config_trace_ring());
    if (!r)
        return (u64)-EINVAL;
    u64 pos;
    u32 len = TRACE_HEAD + (u32)n + 1;
    u8 *to = ring_reserve(r, len, &pos);
    if (!to)
        return (u64)-ENOSPC;
    u64 *args = (u64 *)to;
    args[0] = 0;
    args[1] = 0;
    args[2] = 0;
    trace_stamp(to);
    copy_bytes(to + TRACE_HEAD, s, n);
    to[TRACE_HEAD + n] = 0;
    ring_commit(r, pos, len, RECORD_RAW);
    return 0;
}

/* Device memory is all one address space to a probe: reads go straight through. A bad
 * address faults the kernel as the application's own bad access would; the verifier's
 * GPU rules are what keep probes from making one up. */
static u64 probe_read(u64 dst, u64 size, u64 src)
{
    if (!src && size) {
        for (u64 i = 0; i < size; i++)
            ((u8 *)dst)[i] = 0;
        return (u64)-EFAULT;
    }
    copy_bytes((u8 *)dst, (const u8 *)src, size);
    return 0;
}

static u64 probe_read_str(u64 dst, u64 size, u64 src)
{
    u8 *d = (u8 *)dst;
    const u8 *s = (const u8 *)src;
    if (!size)
        return 0;
    if (!s) {
        d[0] = 0;
        return (u64)-EFAULT;
    }
    u64 n = 0;
    while (n + 1 < size && s[n]) {
        d[n] = s[n];
        n++;
    }
    d[n] = 0;
    return n + 1;
}

u64 bpftime_gpu_probe_read(u64 dst, u64 size, u64 src, u64 r4, u64 r5) { return probe_read(dst, size, src); }
u64 bpftime_gpu_probe_read_user(u64 dst, u64 size, u64 src, u64 r4, u64 r5) { return probe_read(dst, size, src); }
u64 bpftime_gpu_probe_read_kernel(u64 dst, u64 size, u64 src, u64 r4, u64 r5) { return probe_read(dst, size, src); }
u64 bpftime_gpu_probe_read_str(u64 dst, u64 size, u64 src, u64 r4, u64 r5) { return probe_read_str(dst, size, src); }
u64 bpftime_gpu_probe_read_user_str(u64 dst, u64 size, u64 src, u64 r4, u64 r5) { return probe_read_str(dst, size, src); }
u64 bpftime_gpu_probe_read_kernel_str(u64 dst, u64 size, u64 src, u64 r4, u64 r5) { return probe_read_str(dst, size, src); }

/* bpftime's helper 507: the thread stops here. */
u64 bpftime_gpu_exit(u64 r1, u64 r2, u64 r3, u64 r4, u64 r5)
{
#ifndef BPFTIME_HOST_TEST
    __asm__ volatile("exit;");
#endif
    return 0;
}

u64 bpftime_gpu_get_current_pid_tgid(u64 r1, u64 r2, u64 r3, u64 r4, u64 r5)
{
    return bpftime_gpu_config_pid_tgid();
}

/* A 32-bit value from the global timer, the thread's place and a counter-free mix
 * (splitmix64): different in every thread and every call a thread makes at another
 * time. Not for cryptography, like the kernel's. */
u64 bpftime_gpu_get_prandom_u32(u64 r1, u64 r2, u64 r3, u64 r4, u64 r5)
{
    u64 x = __nvvm_read_ptx_sreg_globaltimer();
    x ^= (u64)__nvvm_read_ptx_sreg_clock() << 32;
    x ^= ((u64)__nvvm_read_ptx_sreg_ctaid_x() << 40) ^ ((u64)__nvvm_read_ptx_sreg_tid_x() << 20) ^
         ((u64)__nvvm_read_ptx_sreg_ctaid_y() << 8) ^ __nvvm_read_ptx_sreg_tid_y();
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (u32)x;
}

#endif /* BPFTIME_TABLE_ONLY */
