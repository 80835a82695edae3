//! What the crate's unit tests share: a shim in a store of its own, removed at the end.

use crate::core::{Shim, SysResult};
use bpftime_runtime::Store;

/// A shim over the private store `unit-<tag>-<pid>`.
pub(crate) struct TempShim(pub(crate) Option<Shim>, pub(crate) String);

impl TempShim {
    pub(crate) fn new(tag: &str) -> TempShim {
        let name = format!("unit-{tag}-{}", std::process::id());
        let _ = std::fs::remove_dir_all(Store::dir_for(&name));
        TempShim(Some(Shim::new(Store::create_or_open(&name).unwrap())), name)
    }

    pub(crate) fn shim(&mut self) -> &mut Shim {
        self.0.as_mut().unwrap()
    }

    pub(crate) fn bpf(&mut self, command: u32, attr: &mut [u8; 128]) -> SysResult {
        // SAFETY: attr is 128 writable bytes; the tests put in it only null pointers or
        // pointers to live buffers of the sizes their calls give them.
        unsafe { self.shim().bpf(command, attr.as_mut_ptr(), 128) }
    }
}

impl Drop for TempShim {
    fn drop(&mut self) {
        drop(self.0.take());
        let _ = std::fs::remove_dir_all(Store::dir_for(&self.1));
    }
}
