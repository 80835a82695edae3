//! Writing to stdout and stderr without dying when they are gone.
//!
//! `println!` and `eprintln!` panic when the write fails, as it does once the reader of a
//! pipe has exited (`bpftime run ... | head -2`): the command would abort in the middle
//! of its work, leaving its store behind. Here a failed write means "nobody reads this
//! any more": the stream is written no more, and the command carries on and exits as it
//! would have.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
static STDERR_GONE: AtomicBool = AtomicBool::new(false);

fn write_to(mut w: impl Write, gone: &AtomicBool, args: Arguments<'_>) {
    if gone.load(Ordering::Relaxed) {
        return;
    }
    if w.write_fmt(args).and_then(|()| w.flush()).is_err() {
        gone.store(true, Ordering::Relaxed);
    }
}

/// Writes to stdout unless it is gone.
pub fn out(args: Arguments<'_>) {
    write_to(std::io::stdout().lock(), &STDOUT_GONE, args);
}

/// Writes to stderr unless it is gone.
pub fn err(args: Arguments<'_>) {
    write_to(std::io::stderr().lock(), &STDERR_GONE, args);
}

/// `println!` that never panics (see the module's comment).
macro_rules! outln {
    () => { $crate::output::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that never panics.
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::output::err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` that never panics.
macro_rules! err {
    ($($arg:tt)*) => { $crate::output::err(format_args!($($arg)*)) };
}
