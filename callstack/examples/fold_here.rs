//! The capture as C functions, for the tests: a Python script calls them through ctypes
//! (by way of a small C library the test builds, or directly) and gets the folded stack
//! of its own call back as text.

use std::ffi::c_char;
use std::sync::OnceLock;
use std::time::Instant;

use bpftime_callstack::{containing_object, Capturer, Stack};
use bpftime_ffi_guard::ffi_guard;

fn capturer() -> &'static Capturer {
    static C: OnceLock<Capturer> = OnceLock::new();
    C.get_or_init(Capturer::new)
}

/// This library's path: its frames, on top of every stack, are left out as the agent's
/// are.
fn own_object() -> String {
    containing_object(own_object as *const () as usize + 1).0
}

/// Writes `text` and a NUL into `buf` (`len` bytes); its length, or -1 where it does not
/// fit.
fn give(text: &str, buf: *mut c_char, len: usize) -> isize {
    if buf.is_null() || text.len() + 1 > len {
        return -1;
    }
    // SAFETY: the caller gave `len` writable bytes at `buf`, and `text` and its NUL fit.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    text.len() as isize
}

fn folded(stack: &Stack) -> String {
    capturer().namer().fold(stack, &[own_object()]).join(";")
}

/// The caller's folded stack, outermost first, `;` between frames.
///
/// # Safety
/// `buf` is `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn bpftime_callstack_fold(buf: *mut c_char, len: usize) -> isize {
    ffi_guard!("bpftime_callstack_fold", -2, {
        let stack = capturer().capture();
        give(&folded(&stack), buf, len)
    })
}

/// The same with the Python frames found from `thread_state`, which may be anything.
///
/// # Safety
/// `buf` is `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn bpftime_callstack_fold_from(
    thread_state: usize,
    buf: *mut c_char,
    len: usize,
) -> isize {
    ffi_guard!("bpftime_callstack_fold_from", -2, {
        let stack = capturer().capture_from_thread_state(thread_state);
        give(&folded(&stack), buf, len)
    })
}

/// The line of code unit `unit` in `table` (`len` bytes of a CPython 3.`minor` code
/// object's `co_linetable`, from line `first_line`), or -1 where it has none.
///
/// # Safety
/// `table` is `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn bpftime_callstack_line_of(
    minor: u8,
    table: *const u8,
    len: usize,
    first_line: i32,
    unit: i32,
) -> i64 {
    ffi_guard!("bpftime_callstack_line_of", -2, {
        if table.is_null() {
            return -2;
        }
        // SAFETY: the caller gave `len` readable bytes at `table`.
        let table = unsafe { std::slice::from_raw_parts(table, len) };
        bpftime_callstack::line_of(minor, table, first_line, unit).map_or(-1, i64::from)
    })
}

/// The CPython version whose frames are read (`312`), 0 without Python, -1 where the
/// Python here is refused.
#[no_mangle]
pub extern "C" fn bpftime_callstack_python() -> i32 {
    ffi_guard!("bpftime_callstack_python", -2, {
        match bpftime_callstack::python_version() {
            Ok(Some((major, minor))) => i32::from(major) * 100 + i32::from(minor),
            Ok(None) => 0,
            Err(e) => {
                eprintln!("bpftime_callstack_python: {e}");
                -1
            }
        }
    })
}

/// Nanoseconds per capture with Python frames and without, and of the Python frames
/// alone (`out[0..3]`): the median of 7 rounds of `n` captures each, the kinds taking
/// turns so that all see the same machine.
///
/// # Safety
/// `out` is three writable doubles.
#[no_mangle]
pub unsafe extern "C" fn bpftime_callstack_capture_ns(n: u32, out: *mut f64) -> i32 {
    ffi_guard!("bpftime_callstack_capture_ns", -1, {
        let native = Capturer::native_only();
        let python = capturer();
        // The first capture meets the code objects; the rest are what every launch pays.
        std::hint::black_box(python.capture());
        let round = |c: &Capturer| {
            let began = Instant::now();
            for _ in 0..n {
                std::hint::black_box(c.capture());
            }
            began.elapsed().as_nanos() as f64 / f64::from(n.max(1))
        };
        let python_only = || {
            let began = Instant::now();
            for _ in 0..n {
                std::hint::black_box(python.capture_python_only());
            }
            began.elapsed().as_nanos() as f64 / f64::from(n.max(1))
        };
        let (mut with, mut without, mut alone) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..7 {
            with.push(round(python));
            without.push(round(&native));
            alone.push(python_only());
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        if out.is_null() {
            return -1;
        }
        // SAFETY: the caller gave three writable doubles at `out`.
        unsafe {
            *out = median(&mut with);
            *out.add(1) = median(&mut without);
            *out.add(2) = median(&mut alone);
        }
        0
    })
}
