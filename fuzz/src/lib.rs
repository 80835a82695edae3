//! What the fuzz targets share: a reader of the fuzzer's bytes, and a private
//! store root so that no target touches `/dev/shm/bpftime-*` of real users.

mod guarded;
pub use guarded::Guarded;

use std::path::PathBuf;
use std::sync::Once;

/// Reads the fuzzer's input front to back; past its end every read is zero, so any
/// input decodes to something and short inputs stay meaningful.
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Up to `n` bytes (fewer at the end of the input).
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// `n` bytes, the input's as far as it goes, then zeros.
    pub fn fill(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.take(n).to_vec();
        v.resize(n, 0);
        v
    }

    /// Whatever is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// Points `BPFTIME_SHM_ROOT` at a directory of this process's own, once, before
/// any store is opened; returns it.
pub fn private_store_root() -> PathBuf {
    static ONCE: Once = Once::new();
    let root = store_root();
    ONCE.call_once(|| {
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create the fuzzer's store root");
        // Before any thread that reads the environment exists (the fuzzer's loop is
        // single-threaded and this runs at its first input).
        std::env::set_var("BPFTIME_SHM_ROOT", &root);
        // The shim's refusals are logged at `info`; a fuzzer prints none of them.
        std::env::set_var("BPFTIME_LOG", "off");
        // SAFETY: registers a function without arguments that only removes files.
        unsafe { libc::atexit(remove_store_root) };
    });
    root
}

fn store_root() -> PathBuf {
    std::env::temp_dir().join(format!("bpftime-fuzz-{}", std::process::id()))
}

/// libFuzzer leaves through exit(): the stores go with the process.
extern "C" fn remove_store_root() {
    let _ = std::fs::remove_dir_all(store_root());
}
