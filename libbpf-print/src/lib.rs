//! libbpf's messages, formatted by libc, for every program of ours that links libbpf
//! (the `bpftime` command and the example loaders).
//!
//! libbpf hands its print callback a printf format and a `va_list`. libbpf-rs's
//! callback formats them in Rust and panics on a message that is not UTF-8 (a map or
//! program name with a stray byte in a damaged object), inside an `extern "C"` function:
//! the process aborts. Ours lets libc's `vasprintf` do the formatting, converts the
//! bytes lossily, and catches any panic before it reaches libbpf.

use libbpf_rs::libbpf_sys::{self, __va_list_tag, libbpf_print_level};
use libbpf_rs::PrintLevel;
use std::ffi::{c_char, c_int};
use std::sync::Mutex;

/// Where messages go, and the least important level that is passed on.
type Sink = fn(PrintLevel, &str);

static SINK: Mutex<Option<(PrintLevel, Sink)>> = Mutex::new(None);

extern "C" {
    // glibc's: formats into a buffer it allocates to fit, so that no message (a
    // verifier log libbpf prints whole) is cut.
    fn vasprintf(out: *mut *mut c_char, fmt: *const c_char, ap: *mut __va_list_tag) -> c_int;
}

fn level_of(level: libbpf_print_level) -> PrintLevel {
    match level {
        libbpf_sys::LIBBPF_DEBUG => PrintLevel::Debug,
        libbpf_sys::LIBBPF_INFO => PrintLevel::Info,
        _ => PrintLevel::Warn,
    }
}

unsafe extern "C" fn print(
    level: libbpf_print_level,
    fmt: *const c_char,
    ap: *mut __va_list_tag,
) -> c_int {
    // Nothing may unwind into libbpf's C frames.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let level = level_of(level);
        let sink = *SINK.lock().unwrap_or_else(|p| p.into_inner());
        let Some((min, sink)) = sink else { return };
        if level > min || fmt.is_null() {
            return;
        }
        let mut text: *mut c_char = std::ptr::null_mut();
        // SAFETY: `fmt` and `ap` are the format and arguments libbpf passed for this
        // call, used once; vasprintf allocates `text` on success.
        let n = unsafe { vasprintf(&mut text, fmt, ap) };
        if n < 0 || text.is_null() {
            return;
        }
        // SAFETY: vasprintf wrote `n` bytes and a NUL at `text`.
        let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), n as usize) };
        let msg = String::from_utf8_lossy(bytes).into_owned();
        // SAFETY: allocated by vasprintf with malloc, not used after this.
        unsafe { libc::free(text.cast()) };
        sink(level, &msg);
    }));
    0
}

/// Sends libbpf's messages of `min` and more important ones to `sink` (`None`: drops them).
pub fn set(sink: Option<(PrintLevel, Sink)>) {
    *SINK.lock().unwrap_or_else(|p| p.into_inner()) = sink;
    // SAFETY: `print` has the signature libbpf expects and stays valid for the
    // process's life.
    unsafe { libbpf_sys::libbpf_set_print(Some(print)) };
}

/// Sends libbpf's messages to stderr (its debug chatter only when `verbose`).
pub fn to_stderr(verbose: bool) {
    let level = if verbose {
        PrintLevel::Debug
    } else {
        PrintLevel::Info
    };
    set(Some((level, write_stderr)));
}

/// A closed or full stderr loses the message rather than panicking inside libbpf's call.
fn write_stderr(_: PrintLevel, msg: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(msg.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn keep(_: PrintLevel, msg: &str) {
        SEEN.lock().unwrap().push(msg.to_owned());
    }

    #[test]
    fn a_message_that_is_not_utf8_reaches_the_sink_lossily() {
        set(Some((PrintLevel::Debug, keep)));
        // libbpf names the object in its complaint about bytes that are not ELF; a
        // name with a stray byte is what a damaged object gives.
        let name = b"obj\xff\xfe-name\0";
        let junk = [0x7fu8, b'E', b'L', b'X', 0, 0, 0, 0];
        let opts = libbpf_sys::bpf_object_open_opts {
            sz: std::mem::size_of::<libbpf_sys::bpf_object_open_opts>() as _,
            object_name: name.as_ptr().cast(),
            ..Default::default()
        };
        // SAFETY: `junk`, `name` and `opts` outlive the call; libbpf copies what it keeps.
        let obj = unsafe {
            libbpf_sys::bpf_object__open_mem(junk.as_ptr().cast(), junk.len() as _, &opts)
        };
        assert!(obj.is_null(), "libbpf opened 8 bytes of junk");
        set(None);
        let seen = SEEN.lock().unwrap();
        assert!(
            seen.iter().any(|m| m.contains("obj\u{fffd}\u{fffd}-name")),
            "no message named the object: {seen:?}"
        );
    }
}
