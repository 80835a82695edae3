//! `bpf()` sent to the real kernel or to the shim in this process, with the same
//! 128-byte `bpf_attr`: what the differential tests and the map benchmarks share.

use bpftime_shim::Shim;

use crate::kernel_object::{assert_kernel_object, BpfObject};

/// A `bpf()` result: the return value, or the errno.
pub type Res = Result<i64, i32>;

/// Something that serves `bpf()`.
pub trait Bpf {
    fn call(&mut self, command: u32, attr: &mut [u8; 128]) -> Res;
}

/// The running kernel. Every fd it returns is checked to be a kernel object
/// ([`assert_kernel_object`]): a test binary whose `bpf()` reaches our own shim
/// instead fails rather than comparing bpftime with itself.
pub struct Kernel;

/// What the `bpf()` command `command` returns an fd of, if it returns one whose kind
/// the command alone tells.
fn returns_fd_of(command: u32) -> Option<BpfObject> {
    // `enum bpf_cmd` (this library does not depend on bpftime-isa, which names them).
    match command {
        0 | 14 => Some(BpfObject::Map),        // MAP_CREATE, MAP_GET_FD_BY_ID
        5 | 13 => Some(BpfObject::Prog),       // PROG_LOAD, PROG_GET_FD_BY_ID
        18 | 19 => Some(BpfObject::Btf),       // BTF_LOAD, BTF_GET_FD_BY_ID
        17 | 28 | 30 => Some(BpfObject::Link), // RAW_TRACEPOINT_OPEN, LINK_CREATE, LINK_GET_FD_BY_ID
        _ => None,
    }
}

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
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        if let Some(kind) = returns_fd_of(command) {
            assert_kernel_object(r as i32, kind, &format!("bpf() command {command}"));
        }
        Ok(r)
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
