//! Detours: a function replaced by another that can still call the original, for hooking
//! libraries whose calls must be changed rather than observed (the CUDA driver's entry
//! points, where a launch is sent to an instrumented kernel instead).
//!
//! The function's first bytes become a jump to a thunk near it, which jumps on to the
//! replacement; the replacement reaches the function as it was through
//! [`Detour::original`], the relocated prologue followed by a jump back. The same `int3`
//! protocol as for hooks keeps threads that arrive mid-patch safe, and the code pages are
//! never writable and executable at once, nor ever freed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

use crate::error::AttachError;
use crate::patch::{self, SiteOwner};

/// A detoured function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detour {
    /// The detoured function's address.
    pub addr: usize,
    /// Calls the function as it was, with the same signature.
    pub original: usize,
}

struct Installed {
    detour: Detour,
    /// The original bytes under what was written: a jump, or a breakpoint where the jump
    /// could not safely go in.
    bytes: Vec<u8>,
}

static DETOURS: LazyLock<Mutex<HashMap<usize, Installed>>> = LazyLock::new(Default::default);

/// Sends every call of the function at `addr` to `replacement`. `original` receives
/// [`Detour::original`] before the first call can reach the replacement, which reads it
/// from there to call the function as it was.
///
/// # Safety
/// `addr` must be the entry of a function that nothing jumps into within its first 5
/// bytes, and `replacement` a function of the same signature and ABI that stays mapped for
/// good (a thread may be on its way into it after [`remove_detour`]). Calling
/// [`Detour::original`] with the original's contract runs the function unchanged.
pub unsafe fn detour(
    addr: usize,
    replacement: usize,
    original: &'static AtomicUsize,
) -> Result<Detour, AttachError> {
    let mut detours = DETOURS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = detours.get(&addr) {
        return Err(AttachError::Unhookable {
            addr,
            reason: format!("already detoured (to call {:#x})", d.detour.original),
        });
    }
    if patch::claim_site(addr, SiteOwner::Detour).is_err() {
        return Err(AttachError::Unhookable {
            addr,
            reason: "a uprobe is attached there".into(),
        });
    }
    let written = (|| {
        let code = patch::build_detour(addr, replacement)?;
        original.store(code.original_entry, Ordering::Release);
        patch::register_trap(addr, code.thunk)?;
        let written = patch::write_jump(addr, code.thunk, &code.interior)?;
        Ok((code, written))
    })();
    let (code, written) = match written {
        Ok(w) => w,
        Err(e) => {
            patch::release_site(addr, SiteOwner::Detour);
            return Err(e);
        }
    };
    let detour = Detour {
        addr,
        original: code.original_entry,
    };
    detours.insert(
        addr,
        Installed {
            detour,
            bytes: code.original[..written.len()].to_vec(),
        },
    );
    tracing::debug!(
        addr = format_args!("{addr:#x}"),
        replacement = format_args!("{replacement:#x}"),
        "detoured"
    );
    Ok(detour)
}

/// Puts the function back as it was. `detour.original` stays callable.
pub fn remove_detour(detour: Detour) -> Result<(), AttachError> {
    let mut detours = DETOURS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(installed) = detours.remove(&detour.addr) else {
        return Err(AttachError::Unhookable {
            addr: detour.addr,
            reason: "not detoured".into(),
        });
    };
    patch::restore(detour.addr, &installed.bytes)?;
    patch::release_site(detour.addr, SiteOwner::Detour);
    Ok(())
}
