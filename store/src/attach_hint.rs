//! The file `bpftime attach` leaves for the process it injects the agent into,
//! `/dev/shm/bpftime-inject-<pid>`: the store to use, and where the agent reports a
//! failure to start. It lies in a directory every user can write to, so it is opened
//! without following a link, never created here, and used only when its owner is root
//! or the caller: a file another user planted names no store for us, and a link cannot
//! make us write to what it points at.

use std::io::{Read, Write};
use std::path::Path;

/// The store name in the hint at `path`; None when there is no usable hint.
pub fn read_attach_hint(path: &Path) -> Option<String> {
    let mut text = String::new();
    bpftime_abi::open_attach_hint(path, false)?
        .take(256)
        .read_to_string(&mut text)
        .ok()?;
    let name = text.trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// Tells a waiting `bpftime attach` why the agent did not start: only into a hint that
/// is still there (`attach` may have given up and removed it).
pub fn report_to_attach(path: &Path, why: &str) {
    let Some(mut f) = bpftime_abi::open_attach_hint(path, true) else {
        return;
    };
    if f.set_len(0).is_ok() {
        let _ = f.write_all(format!("error: {why}").as_bytes());
    }
}
