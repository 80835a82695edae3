//! `bpf()` sent to the real kernel or to the shim in this process, with the same
//! 128-byte `bpf_attr`: what the differential tests and the map benchmarks share.

use bpftime_shim::Shim;

/// A `bpf()` result: the return value, or the errno.
pub type Res = Result<i64, i32>;

/// Something that serves `bpf()`.
pub trait Bpf {
    fn call(&mut self, command: u32, attr: &mut [u8; 128]) -> Res;
}

/// The running kernel.
pub struct Kernel;

impl Bpf for Kernel {
    fn call(&mut self, command: u32, attr: &mut [u8; 128]) -> Res {
        // SAFETY: attr is a 128-byte bpf_attr whose pointers point at live buffers of
        // the caller's.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                command as libc::c_long,
                attr.as_mut_ptr(),
                128usize,
            )
        };
        if r < 0 {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        } else {
            Ok(r)
        }
    }
}

/// bpftime's shim, called in process (no preload).
pub struct Ours(pub Shim);

impl Bpf for Ours {
    fn call(&mut self, command: u32, attr: &mut [u8; 128]) -> Res {
        // SAFETY: as for the kernel.
        unsafe { self.0.bpf(command, attr.as_mut_ptr(), 128) }
    }
}

pub fn put32(a: &mut [u8; 128], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

pub fn put64(a: &mut [u8; 128], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}
