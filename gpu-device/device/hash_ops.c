/*
 * The kernel that makes the CPU's changes to a per-CPU hash map on the device, in a
 * launch's stream order (device_maps.rs, `HashOp`): a key made or deleted on the CPU, and
 * what a CPU changed in its value, as additions to the copy of the SM that CPU's values go
 * to. The ops travel in the kernel's parameters, so a later push never overwrites ops a
 * queued launch has yet to read; one thread makes them in order, with the same table code
 * the probes use (runtime.c, included), so that a key the CPU makes meets the keys probes
 * insert exactly as two probes' inserts meet.
 *
 * Compiled by build.rs with clang-19 straight to PTX, loaded once per context.
 */

/* runtime.c's table code alone, not the helpers (which need per-context values). */
#define BPFTIME_TABLE_ONLY
#pragma clang diagnostic ignored "-Wunused-function"
#include "runtime.c"

/* An op's kind, with OP_MAKE set: insert the key (every copy zeroed) if it is missing. */
#define OP_ADD64 1u
#define OP_ADD32 2u
#define OP_WRITE 3u   /* `len` (< 8) bytes of `value` at `offset` */
#define OP_DELETE 4u
#define OP_NONE 5u    /* only OP_MAKE: a key whose values are all zero */
#define OP_MAKE (1u << 8)

/* An op: this header, then the key, `key_stride` bytes. */
struct hash_op {
    u32 kind;
    u32 copy;     /* the SM copy the value change goes to */
    u32 offset;   /* in the value */
    u32 len;
    u64 value;    /* what to add, or the bytes to write */
};

#define OPS_BYTES 4000

struct hash_ops {
    u64 words[OPS_BYTES / 8];
};

__attribute__((nvptx_kernel))
void __bpftime_hash_ops(u64 map, u64 done, u64 seq, u32 count, struct hash_ops ops)
{
    const struct gpu_map *m = (const struct gpu_map *)map;
    u64 size = sizeof(struct hash_op) + m->key_stride;
    for (u32 i = 0; i < count && (i + 1) * size <= OPS_BYTES; i++) {
        const struct hash_op *op = (const struct hash_op *)((const u8 *)ops.words + i * size);
        const u8 *key = (const u8 *)(op + 1);
        u32 kind = op->kind & 0xff;
        if (kind == OP_DELETE) {
            hash_delete(m, key);
            continue;
        }
        s64 slot = hash_find(m, key);
        int fresh = 0;
        if (slot < 0 && (op->kind & OP_MAKE)) {
            s64 found = -1;
            slot = hash_insert(m, key, &found);
            if (slot == -EEXIST)
                slot = found;
            else
                fresh = slot >= 0;
        }
        if (slot < 0 || op->copy >= m->copies)
            continue;
        u8 *v = (u8 *)m->values + ((u64)slot * m->copies + op->copy) * m->value_stride;
        if (kind == OP_ADD64 && op->offset + 8 <= m->value_size)
            __atomic_fetch_add((u64 *)(v + op->offset), op->value, __ATOMIC_RELAXED);
        else if (kind == OP_ADD32 && op->offset + 4 <= m->value_size)
            __atomic_fetch_add((u32 *)(v + op->offset), (u32)op->value, __ATOMIC_RELAXED);
        else if (kind == OP_WRITE && op->len < 8 && op->offset + op->len <= m->value_size)
            for (u32 b = 0; b < op->len; b++)
                v[op->offset + b] = (u8)(op->value >> (8 * b));
        if (fresh)
            publish_slot(m, (u32)slot);
    }
    __nvvm_membar_gl();
    *(volatile u64 *)done = seq;
}
