//! The text of GPU code, the first stage of GPU attach (docs/ARCHITECTURE.md): plain data
//! in, plain data out, no CUDA driver needed.
//!
//! - [`fatbin`] reads the device code a program hands the driver and picks the PTX that
//!   fits the device; [`elf_fatbins`] finds the fatbins nvcc linked into an ELF object.
//! - [`ptx`] parses a PTX module's kernels and splices probe calls into them, [`inline`]
//!   puts a probe's body in place of its calls where that pays.
//! - [`names`] says which kernels a probe's pattern names.
//! - [`toolchain`] finds NVIDIA's compilers (`ptxas`, `nvcc`) for the checks that use them.

pub mod elf_fatbins;
pub mod fatbin;
pub mod inline;
pub mod names;
pub mod ptx;
pub mod toolchain;

pub use ptx::ProbePoint;

/// FNV-1a of `bytes`, as the device runtime's `hash_key` (device/runtime.c) computes it:
/// kernels' ids and device hash tables' buckets.
pub fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for &b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(16_777_619);
    }
    h
}
