//! The kernels of our own that keep device maps in step, run in the application's
//! streams around its launches: one makes the CPU's changes to arrays on the device, one
//! folds sharded arrays' per-SM copies into them. Hand-written PTX, in device/.

/// The kernel that makes the CPU's changes to array values on the device, in a launch's
/// stream order, as additions (`replica::DeviceDelta`): up to [`DELTAS_PER_LAUNCH`]
/// (address, value) pairs in its parameters, one thread each. Bit 0 of an address marks
/// a 4-byte word.
pub const APPLY_DELTAS_PTX: &str = include_str!("../device/apply_deltas.ptx");
pub const DELTAS_PER_LAUNCH: usize = 64;

/// The kernel that folds sharded arrays' per-SM copies into them (runtime.c's `struct
/// shard_entry`), queued in a launch's stream after each instrumented kernel whose probes
/// use one: one launch for up to [`FOLD_ENTRIES`] arrays (a kernel launch in the
/// application's stream costs microseconds of its time, and memtrace alone has seven
/// arrays), their entries in its parameters (base, len, shards64, shards32, stride,
/// copies: 48 bytes each). The grid's `y` is the copy (the SM), its `x` the 8-byte words
/// of every array's 8-byte copies then of its 4-byte copies, so a thread finds its word
/// without a division; a word that is not zero is taken (exchanged with 0) and added to
/// the array, a 4-byte copy's word as its two halves. It runs inside the application's
/// timing of its kernel, and most words are zero: a thread reads 8 bytes of either kind,
/// and the copies at or past `%nsmid`, which no SM writes (copies are a power of two of
/// them: 256 for an H200's 132 SMs), are not read (memtrace on vectorAdd: 2.06x to 2.02x
/// against the kernel with a division per thread and every copy read).
pub const FOLD_SHARDS_PTX: &str = include_str!("../device/fold_shards.ptx");
/// Arrays one fold launch takes (its 768-byte parameter list).
pub const FOLD_ENTRIES: usize = 16;
/// Threads per block of the fold kernel.
pub const FOLD_THREADS: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_ptxas_accepts(name: &str, text: &str) {
        let Some(ptxas) = bpftime_gpu_ptx::toolchain::ptxas_for_tests() else {
            return;
        };
        // CUDA 13's ptxas starts at sm_75.
        for sm in [75, 90] {
            bpftime_gpu_ptx::toolchain::ptxas_accepts(&ptxas, name, text, sm, false)
                .unwrap_or_else(|e| panic!("{name} for sm_{sm}: {e}"));
        }
    }

    #[test]
    fn the_apply_kernel_passes_ptxas() {
        // 64 (address, value) pairs fill the kernel's 1024-byte list.
        assert!(APPLY_DELTAS_PTX.contains(&format!("__bt_list[{}]", DELTAS_PER_LAUNCH * 16)));
        assert_ptxas_accepts("apply_deltas", APPLY_DELTAS_PTX);
    }

    #[test]
    fn the_fold_kernel_passes_ptxas() {
        // FOLD_ENTRIES entries of six u64s fill the kernel's parameter list.
        assert!(FOLD_SHARDS_PTX.contains(&format!("__bt_entries[{}]", FOLD_ENTRIES * 48)));
        assert_ptxas_accepts("fold_shards", FOLD_SHARDS_PTX);
    }
}
