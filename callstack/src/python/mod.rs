//! The CPython interpreter in this process, if any, and the Python frames of the calling
//! thread.
//!
//! Found once: the interpreter's symbols in the process (a `python3.X` executable or a
//! `libpython3.X.so`, loaded globally or not), its version (`Py_Version`, or
//! `Py_GetVersion()`'s text in 3.10) and so its layout ([`layout`]). A process without
//! Python pays that one look-up and nothing more.
//!
//! At each capture: the thread's own thread state (`PyGILState_GetThisThreadState`,
//! which holds whether or not the thread holds the GIL, as a thread that called into C
//! through ctypes or a PyTorch operator may not), then its frames ([`walk`]) and, per
//! frame, its code object ([`code`]).

mod code;
mod layout;
mod lines;
mod memory;
mod walk;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

pub(crate) use code::{Codes, PyEntry, UNNAMED};
use layout::Layout;
use memory::{Memory, OwnMemory};

/// Why the Python frames of this process are not shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PythonError {
    #[error("CPython {major}.{minor}'s frames are not read (3.10 to 3.13 are)")]
    Version { major: u8, minor: u8 },
    #[error("the Python interpreter in this process has no {0}")]
    Symbol(&'static str),
    #[error("CPython 3.{minor} is not laid out as its headers say: {why}")]
    Layout { minor: u8, why: String },
}

/// The interpreter found in this process.
pub(crate) struct Interpreter {
    pub(crate) minor: u8,
    pub(crate) layout: Layout,
    /// `&PyCode_Type`: every frame's code object must have it.
    pub(crate) code_type: usize,
    /// `&PyFrame_Type` (3.10, where frames are objects).
    frame_type: usize,
    this_thread_state: Option<unsafe extern "C" fn() -> *mut c_void>,
    is_initialized: Option<unsafe extern "C" fn() -> c_int>,
}

static FOUND: OnceLock<Result<Option<Interpreter>, PythonError>> = OnceLock::new();

/// The interpreter in this process: none where there is no Python, an error where there
/// is one whose frames are not read.
pub(crate) fn interpreter() -> Result<Option<&'static Interpreter>, &'static PythonError> {
    match FOUND.get_or_init(find) {
        Ok(i) => Ok(i.as_ref()),
        Err(e) => Err(e),
    }
}

impl Interpreter {
    /// Appends the calling thread's Python frames to `out` (innermost first), or nothing
    /// where the thread runs no Python.
    pub(crate) fn capture(&self, codes: &std::sync::Mutex<Codes>, out: &mut Vec<PyEntry>) {
        let (Some(initialized), Some(this_thread)) = (self.is_initialized, self.this_thread_state)
        else {
            return;
        };
        // SAFETY: CPython's `Py_IsInitialized` takes nothing and reads a flag; it may be
        // called at any time, from any thread.
        if unsafe { initialized() } == 0 {
            return;
        }
        // SAFETY: CPython's `PyGILState_GetThisThreadState` takes nothing and reads this
        // thread's slot of a thread-specific key; it does not need the GIL.
        let tstate = unsafe { this_thread() } as usize;
        if tstate == 0 {
            return;
        }
        self.capture_from(tstate, codes, out);
    }

    /// As [`Interpreter::capture`] from the thread state at `tstate` (which the tests
    /// make anything).
    pub(crate) fn capture_from(
        &self,
        tstate: usize,
        codes: &std::sync::Mutex<Codes>,
        out: &mut Vec<PyEntry>,
    ) {
        let mem = OwnMemory::new();
        let mut frames = Vec::with_capacity(64);
        walk::walk(&mem, &self.layout, tstate, self.frame_type, &mut frames);
        let mut codes = codes.lock().unwrap_or_else(|e| e.into_inner());
        codes.add(&mem, self, &frames, out);
    }

    #[cfg(test)]
    pub(crate) fn for_tests(layout: Layout, code_type: usize) -> Interpreter {
        Interpreter {
            minor: layout.minor,
            layout,
            code_type,
            frame_type: 0,
            this_thread_state: None,
            is_initialized: None,
        }
    }
}

/// Where the interpreter's symbols are looked up.
struct Symbols(*mut c_void);

impl Symbols {
    fn get(&self, name: &CStr) -> Option<usize> {
        // SAFETY: dlsym reads the loader's tables; the handle is RTLD_DEFAULT or one that
        // dlopen returned and that is never closed.
        let p = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        (!p.is_null()).then_some(p as usize)
    }
}

fn find() -> Result<Option<Interpreter>, PythonError> {
    let Some(sym) = symbols() else {
        return Ok(None);
    };
    let need = |name: &'static CStr| {
        sym.get(name)
            .ok_or(PythonError::Symbol(name.to_str().unwrap_or("a symbol")))
    };
    let this_thread = need(c"PyGILState_GetThisThreadState")?;
    let initialized = need(c"Py_IsInitialized")?;
    let code_type = need(c"PyCode_Type")?;
    let hex = version(&sym)?;
    let (major, minor) = ((hex >> 24) as u8, (hex >> 16) as u8);
    let mut layout = match (major, minor) {
        (3, 10..=13) => Layout::of(minor).ok_or(PythonError::Version { major, minor })?,
        _ => return Err(PythonError::Version { major, minor }),
    };
    let bad = |why: String| PythonError::Layout { minor, why };
    let mem = OwnMemory::new();
    if minor >= 13 {
        let runtime = need(c"_PyRuntime")?;
        layout = Layout::from_debug_offsets(&mem, runtime, hex).map_err(bad)?;
    }
    // The type's name behind its header tells a build whose objects carry more than the
    // default header (`Py_TRACE_REFS`), which no table here describes.
    let tp_name = mem.word(code_type.wrapping_add(layout.ob_type + 16));
    let mut name = [0u8; 5];
    if !tp_name.is_some_and(|p| mem.read(p, &mut name)) || &name != b"code\0" {
        return Err(bad(
            "its code type is not where a code type's name would be".into(),
        ));
    }
    let frame_type = if minor == 10 {
        need(c"PyFrame_Type")?
    } else {
        0
    };
    // SAFETY: the symbols are CPython's functions of these signatures (no arguments, a
    // pointer or an int back), as every version from 3.10 to 3.13 declares them.
    let (this_thread_state, is_initialized) = unsafe {
        (
            std::mem::transmute::<usize, unsafe extern "C" fn() -> *mut c_void>(this_thread),
            std::mem::transmute::<usize, unsafe extern "C" fn() -> c_int>(initialized),
        )
    };
    Ok(Some(Interpreter {
        minor,
        layout,
        code_type,
        frame_type,
        this_thread_state: Some(this_thread_state),
        is_initialized: Some(is_initialized),
    }))
}

/// `PY_VERSION_HEX` of the interpreter: `Py_Version` (3.11 on), or from the text
/// `Py_GetVersion` gives (`3.10.13 (main, ...)`).
fn version(sym: &Symbols) -> Result<u64, PythonError> {
    if let Some(at) = sym.get(c"Py_Version") {
        let mut v = [0u8; 8];
        if OwnMemory::new().read(at, &mut v) {
            return Ok(u64::from_le_bytes(v));
        }
    }
    let at = sym
        .get(c"Py_GetVersion")
        .ok_or(PythonError::Symbol("Py_GetVersion"))?;
    // SAFETY: CPython's `Py_GetVersion` takes nothing and gives a static NUL-terminated
    // text; it may be called before the interpreter is initialized.
    let text = unsafe {
        let get = std::mem::transmute::<usize, unsafe extern "C" fn() -> *const c_char>(at);
        let p = get();
        if p.is_null() {
            return Err(PythonError::Symbol("Py_GetVersion"));
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    let mut parts = text
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) if major < 256 && minor < 256 => Ok(major << 24 | minor << 16),
        _ => Err(PythonError::Symbol("a version in Py_GetVersion's text")),
    }
}

/// The interpreter's symbols: those the process sees globally (an executable with
/// Python linked in, or a `libpython3.X.so` it links), or else those of a
/// `libpython3.X.so` loaded on its own (an application that embeds Python with
/// `dlopen(RTLD_LOCAL)`).
fn symbols() -> Option<Symbols> {
    let global = Symbols(libc::RTLD_DEFAULT);
    if global.get(c"PyGILState_GetThisThreadState").is_some() {
        return Some(global);
    }
    let mut libraries: Vec<std::ffi::CString> = Vec::new();
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid `dl_phdr_info` and our `data`, a
        // `Vec<CString>`, for the length of the call.
        let (info, found) = unsafe { (&*info, &mut *data.cast::<Vec<std::ffi::CString>>()) };
        if !info.dlpi_name.is_null() {
            // SAFETY: the loader's object names are NUL-terminated.
            let name = unsafe { CStr::from_ptr(info.dlpi_name) };
            let base = name.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or(&[]);
            if base.starts_with(b"libpython3.") {
                found.push(name.to_owned());
            }
        }
        0
    }
    // SAFETY: `each` only reads what the loader passes and pushes into `libraries`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut libraries as *mut Vec<_>).cast()) };
    libraries.into_iter().find_map(|path| {
        // SAFETY: RTLD_NOLOAD only finds an object already loaded (and keeps it loaded,
        // which this handle, never closed, needs).
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        let s = Symbols(h);
        (!h.is_null() && s.get(c"PyGILState_GetThisThreadState").is_some()).then_some(s)
    })
}

/// The line of the code unit `unit` in a copy of a CPython 3.`minor` code object's
/// `co_linetable`: for tests that hold it against CPython's own `co_lines()`.
#[doc(hidden)]
pub fn line_of(minor: u8, table: &[u8], first_line: i32, unit: i32) -> Option<i32> {
    let format = Layout::of(minor)?.line_table;
    lines::line_at(format, table, first_line, unit)
}

/// The `function (file:line)` of a Python frame.
pub(crate) fn describe(codes: &Codes, code: u32, unit: i32) -> String {
    let Some(info) = codes.get(code).filter(|_| code != UNNAMED) else {
        return "? (?)".into();
    };
    let file = short_path(&info.file);
    match info.line(unit) {
        Some(line) => format!("{} ({file}:{line})", info.name),
        None => format!("{} ({file})", info.name),
    }
}

/// A source path as short as still tells where the file is: from the import root where
/// one is known (`torch/nn/modules/module.py`, `threading.py`), otherwise as the code
/// object has it (the script as it was started, a module by its absolute path).
fn short_path(path: &str) -> &str {
    for root in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = path.rfind(root) {
            return &path[i + root.len()..];
        }
    }
    // The standard library: .../lib/python3.X/
    if let Some(i) = path.rfind("/lib/python3.") {
        let rest = &path[i + "/lib/python3.".len()..];
        if let Some(j) = rest.find('/') {
            if rest[..j].bytes().all(|b| b.is_ascii_digit()) {
                return &rest[j + 1..];
            }
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_shown_from_their_import_root() {
        for (path, shown) in [
            (
                "/usr/lib/python3/dist-packages/torch/nn/modules/module.py",
                "torch/nn/modules/module.py",
            ),
            (
                "/venv/lib/python3.12/site-packages/cupy/_core/core.py",
                "cupy/_core/core.py",
            ),
            (
                "/root/.pyenv/versions/3.13.0/lib/python3.13/threading.py",
                "threading.py",
            ),
            ("/usr/lib/python3.11/json/decoder.py", "json/decoder.py"),
            ("train.py", "train.py"),
            (
                "/home/me/model/lib/python3.x/mine.py",
                "/home/me/model/lib/python3.x/mine.py",
            ),
            ("<frozen runpy>", "<frozen runpy>"),
        ] {
            assert_eq!(short_path(path), shown);
        }
    }

    #[test]
    fn a_frame_is_its_function_then_its_file_and_line() {
        let mut codes = Codes::default();
        assert_eq!(describe(&codes, UNNAMED, 0), "? (?)");
        assert_eq!(describe(&codes, 3, 0), "? (?)");
        codes.push_for_tests(code::CodeInfo {
            name: "Model.forward".into(),
            file: "/x/site-packages/m/model.py".into(),
            first_line: 40,
            table: vec![0x80 | (10 << 3) | 1, 0, 0].into(),
            format: layout::LineTable::Locations,
        });
        assert_eq!(describe(&codes, 0, 1), "Model.forward (m/model.py:40)");
        assert_eq!(describe(&codes, 0, 5), "Model.forward (m/model.py)");
        // A module's prologue is on line 0 (its first line less one): no line shown.
        codes.push_for_tests(code::CodeInfo {
            name: "<module>".into(),
            file: "train.py".into(),
            first_line: 1,
            table: vec![0x80 | (13 << 3), 3].into(),
            format: layout::LineTable::Locations,
        });
        assert_eq!(describe(&codes, 1, 0), "<module> (train.py)");
        assert_eq!(line_of(12, &[0x80 | (13 << 3), 3], 1, 0), Some(0));
    }

    #[test]
    fn a_process_without_python_has_no_interpreter() {
        // This test binary links no Python.
        assert!(matches!(interpreter(), Ok(None)));
    }
}
