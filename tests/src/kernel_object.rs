//! Proof that an fd a test got from "the kernel" is a kernel object.
//!
//! A differential test is worthless if its kernel calls never reach the kernel.
//! That happens when the syscall shim's preload layer is linked into the test
//! binary (feature unification under `cargo test --workspace` turns it on): the
//! binary then exports `syscall`, `mmap`, ... and `bpf()` goes to our own shim,
//! which compares bpftime with itself. The kernel names its objects'
//! `/proc/self/fd/N` links `anon_inode:bpf-map`, `anon_inode:bpf-prog`,
//! `anon_inode:bpf_link` and `anon_inode:btf`; nothing else has those names.
//!
//! Shared by the oracle tests of `bpftime-tests`, `bpftime-verifier` and
//! `bpftime-bpf-examples` (the latter two include this file by path), so it
//! needs nothing but std.

#![allow(dead_code)]

/// What a `bpf()` command that returns an fd creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpfObject {
    Map,
    Prog,
    Link,
    Btf,
}

impl BpfObject {
    /// The target of the kernel's `/proc/self/fd/N` link for such an object.
    pub fn link_target(self) -> &'static str {
        match self {
            BpfObject::Map => "anon_inode:bpf-map",
            BpfObject::Prog => "anon_inode:bpf-prog",
            BpfObject::Link => "anon_inode:bpf_link",
            BpfObject::Btf => "anon_inode:btf",
        }
    }
}

/// `Err` with the reason unless `fd` is a kernel object of kind `kind`.
pub fn check_kernel_object(fd: i32, kind: BpfObject) -> Result<(), String> {
    let want = kind.link_target();
    let link = format!("/proc/self/fd/{fd}");
    match std::fs::read_link(&link) {
        Ok(target) if target.as_os_str() == want => Ok(()),
        Ok(target) => Err(format!(
            "fd {fd} should be a kernel {kind:?} (`{want}`) but {link} is `{}`: the kernel \
             was not called. Is the syscall shim's preload layer linked into this test \
             binary (`nm -D <binary> | grep -w syscall`)? Build the package alone \
             (`cargo test -p <package>`) so that no other crate turns the shim's `preload` \
             feature on",
            target.display()
        )),
        Err(e) => Err(format!(
            "fd {fd} should be a kernel {kind:?} (`{want}`) but {link} cannot be read: {e}: \
             the kernel was not called or the fd is already closed"
        )),
    }
}

/// Panics (fails the test) unless `fd`, which `what` got from the kernel path, is a
/// kernel object of kind `kind`.
#[track_caller]
pub fn assert_kernel_object(fd: i32, kind: BpfObject, what: &str) {
    if let Err(why) = check_kernel_object(fd, kind) {
        panic!("{what}: {why}");
    }
}
