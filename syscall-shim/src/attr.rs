//! Field access to `union bpf_attr` and `struct perf_event_attr`, which the
//! caller hands over as raw bytes whose size depends on its headers' version.

/// A copy of the caller's attribute bytes, zero-extended to a known size.
pub(crate) struct Attr {
    bytes: [u8; 256],
}

impl Attr {
    /// # Safety
    /// `ptr` must point to `size` readable bytes.
    pub(crate) unsafe fn read(ptr: *const u8, size: usize) -> Attr {
        let mut bytes = [0u8; 256];
        let n = size.min(bytes.len());
        if !ptr.is_null() {
            // SAFETY: caller obligation; n <= size.
            unsafe { std::ptr::copy_nonoverlapping(ptr, bytes.as_mut_ptr(), n) };
        }
        Attr { bytes }
    }

    pub(crate) fn u32(&self, off: usize) -> u32 {
        u32::from_ne_bytes(self.bytes[off..off + 4].try_into().unwrap_or_default())
    }

    pub(crate) fn u64(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.bytes[off..off + 8].try_into().unwrap_or_default())
    }

    pub(crate) fn str(&self, off: usize, len: usize) -> String {
        let b = &self.bytes[off..off + len];
        let end = b.iter().position(|&c| c == 0).unwrap_or(len);
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
}

/// Writes a value back into the caller's attribute, if it is long enough to hold it.
///
/// # Safety
/// `ptr` must point to `size` writable bytes.
pub(crate) unsafe fn write_back_u32(ptr: *mut u8, size: usize, off: usize, v: u32) {
    if !ptr.is_null() && off + 4 <= size {
        // SAFETY: in bounds per the check and the caller obligation.
        unsafe { std::ptr::write_unaligned(ptr.add(off).cast::<u32>(), v) };
    }
}

// Offsets in `union bpf_attr`, per command.
pub(crate) mod map_create {
    pub const MAP_TYPE: usize = 0;
    pub const KEY_SIZE: usize = 4;
    pub const VALUE_SIZE: usize = 8;
    pub const MAX_ENTRIES: usize = 12;
    pub const MAP_FLAGS: usize = 16;
    pub const INNER_MAP_FD: usize = 20;
    pub const NAME: usize = 28;
    pub const BTF_FD: usize = 48;
    pub const BTF_KEY_TYPE_ID: usize = 52;
    pub const BTF_VALUE_TYPE_ID: usize = 56;
    pub const MAP_EXTRA: usize = 64;
}

pub(crate) mod elem {
    pub const MAP_FD: usize = 0;
    pub const KEY: usize = 8;
    pub const VALUE: usize = 16;
    pub const FLAGS: usize = 24;
}

pub(crate) mod batch {
    pub const IN_BATCH: usize = 0;
    pub const OUT_BATCH: usize = 8;
    pub const KEYS: usize = 16;
    pub const VALUES: usize = 24;
    pub const COUNT: usize = 32;
    pub const MAP_FD: usize = 36;
    pub const ELEM_FLAGS: usize = 40;
}

pub(crate) mod prog_load {
    pub const PROG_TYPE: usize = 0;
    pub const INSN_CNT: usize = 4;
    pub const INSNS: usize = 8;
    pub const LICENSE: usize = 16;
    pub const LOG_LEVEL: usize = 24;
    pub const LOG_SIZE: usize = 28;
    pub const LOG_BUF: usize = 32;
    pub const NAME: usize = 48;
    pub const EXPECTED_ATTACH_TYPE: usize = 68;
    pub const PROG_BTF_FD: usize = 72;
    pub const LINE_INFO_REC_SIZE: usize = 92;
    pub const LINE_INFO: usize = 96;
    pub const LINE_INFO_CNT: usize = 104;
    pub const FD_ARRAY: usize = 120;
    pub const LOG_TRUE_SIZE: usize = 140;
}

pub(crate) mod info_by_fd {
    pub const FD: usize = 0;
    pub const INFO_LEN: usize = 4;
    pub const INFO: usize = 8;
}

pub(crate) mod btf_load {
    pub const BTF: usize = 0;
    pub const SIZE: usize = 16;
}

pub(crate) mod link_create {
    pub const PROG_FD: usize = 0;
    pub const TARGET_FD: usize = 4;
    pub const ATTACH_TYPE: usize = 8;
    pub const PERF_EVENT_COOKIE: usize = 16;
}

pub(crate) mod get_id {
    pub const START_ID: usize = 0;
    pub const NEXT_ID: usize = 4;
}

pub(crate) mod test_run {
    pub const PROG_FD: usize = 0;
    pub const RETVAL: usize = 4;
    pub const DATA_SIZE_IN: usize = 8;
    pub const DATA_SIZE_OUT: usize = 12;
    pub const DATA_IN: usize = 16;
    pub const DATA_OUT: usize = 24;
    pub const REPEAT: usize = 32;
    pub const DURATION: usize = 36;
    pub const CTX_SIZE_IN: usize = 40;
    pub const CTX_SIZE_OUT: usize = 44;
    pub const CTX_IN: usize = 48;
    pub const CTX_OUT: usize = 56;
    pub const FLAGS: usize = 64;
    pub const CPU: usize = 68;
    pub const BATCH_SIZE: usize = 72;
}

/// `BPF_OBJ_PIN` and `BPF_OBJ_GET`.
pub(crate) mod obj {
    pub const PATHNAME: usize = 0;
    pub const BPF_FD: usize = 8;
}
