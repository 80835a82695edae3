//! Native frames: return addresses at capture time, names when they are asked for.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};

/// Native frames kept per stack, innermost first; deeper frames are cut.
pub(crate) const MAX_FRAMES: usize = 256;

/// The calling thread's return addresses, innermost first.
#[inline(never)]
pub(crate) fn capture() -> Box<[usize]> {
    let mut ips = Vec::with_capacity(64);
    backtrace::trace(|frame| {
        let ip = frame.ip() as usize;
        // The outermost frame of a thread has no return address.
        if ip != 0 {
            ips.push(ip);
        }
        ips.len() < MAX_FRAMES
    });
    ips.into_boxed_slice()
}

/// A frame name as the folded format can carry it: no `;` (the separator), no line breaks.
pub fn clean(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

/// One code address: the object it lies in and the function names there (inlined ones
/// first), looked up once.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub object: String,
    pub names: Vec<String>,
}

#[derive(Default)]
pub(crate) struct Symbols {
    frames: HashMap<usize, Frame>,
}

impl Symbols {
    pub(crate) fn lookup(&mut self, ip: usize) -> &Frame {
        self.frames.entry(ip).or_insert_with(|| {
            let (object, exported) = containing_object(ip);
            let mut names = Vec::new();
            backtrace::resolve(ip as *mut c_void, |symbol| {
                if let Some(name) = symbol.name() {
                    names.push(clean(&format!("{name:#}")));
                }
            });
            if names.is_empty() {
                if let Some(sym) = exported {
                    names.push(clean(&format!(
                        "{:#}",
                        backtrace::SymbolName::new(sym.as_bytes())
                    )));
                }
            }
            Frame { object, names }
        })
    }
}

pub(crate) fn basename(path: &str) -> &str {
    match path.rsplit('/').next() {
        Some("") | None => "unknown",
        Some(b) => b,
    }
}

/// The path of the object the code at `ip` (a return address) lies in, and the exported
/// symbol covering it, if any.
pub fn containing_object(ip: usize) -> (String, Option<String>) {
    // SAFETY: `Dl_info` is plain data that dladdr fills in.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // A return address may be one past its function's last byte: look up the call.
    let addr = ip.saturating_sub(1) as *const c_void;
    // SAFETY: dladdr only reads the loader's tables for `addr`.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 {
        return (String::new(), None);
    }
    let text = |p: *const libc::c_char| {
        // SAFETY: dladdr's strings are NUL-terminated and live as long as the object.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    (
        text(info.dli_fname).unwrap_or_default(),
        text(info.dli_sname),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_without_a_separator_or_line_break() {
        assert_eq!(clean("a;b\nc"), "a:b c");
    }

    #[test]
    fn the_capture_starts_at_its_caller() {
        #[inline(never)]
        fn here() -> Box<[usize]> {
            let stack = capture();
            // Not a tail call: this frame stays.
            std::hint::black_box(stack)
        }
        let stack = here();
        let mut s = Symbols::default();
        let names: Vec<String> = stack
            .iter()
            .take(4)
            .flat_map(|&ip| s.lookup(ip).names.clone())
            .collect();
        assert!(names.iter().any(|n| n.contains("here")), "{names:?}");
        assert!(!containing_object(here as *const () as usize + 1)
            .0
            .is_empty());
    }
}
