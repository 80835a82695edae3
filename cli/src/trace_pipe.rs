//! `bpftime trace-pipe`: what programs print with `bpf_trace_printk`, read the
//! way `cat /sys/kernel/tracing/trace_pipe` reads the kernel's: records that
//! were not read yet, then new ones as they arrive, until interrupted.
//!
//! Agents append records to the store's `trace_pipe` file; reading consumes
//! them, as in the kernel: how far readers got is kept beside the file, so a
//! second reader starts where the first one stopped.

use anyhow::{Context, Result};
use bpftime_runtime::Store;
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};

/// How long to wait for a change before looking at the file anyway.
const POLL_MS: i32 = 500;

pub fn main(store: &str) -> Result<()> {
    let store =
        Store::create_or_open(store).with_context(|| format!("cannot open the store `{store}`"))?;
    let changes = DirWatch::new(&store);
    let pipe = TracePipe::new(store)?;
    pipe.follow(|| changes.wait(POLL_MS))
}

struct TracePipe {
    /// The trace file is opened through the store's handle on its directory.
    store: Store,
    /// Where the read position is kept: 8 bytes, the offset and the file's inode.
    consumed: File,
}

impl TracePipe {
    fn new(store: Store) -> Result<TracePipe> {
        let consumed = store.open_trace_position()?;
        Ok(TracePipe { store, consumed })
    }

    /// (offset, inode) read so far; the inode tells a trace file recreated
    /// since (a new store of the same name) from the one the offset is for.
    fn position(&self) -> (u64, u64) {
        let mut b = [0u8; 16];
        match self.consumed.read_exact_at(&mut b, 0) {
            Ok(()) => (
                u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
                u64::from_le_bytes(b[8..].try_into().unwrap_or_default()),
            ),
            Err(_) => (0, 0),
        }
    }

    fn set_position(&self, offset: u64, inode: u64) -> Result<()> {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&offset.to_le_bytes());
        b[8..].copy_from_slice(&inode.to_le_bytes());
        self.consumed
            .write_all_at(&b, 0)
            .context("cannot record the trace pipe's read position")
    }

    /// Copies complete records to stdout as they appear; `wait` blocks until
    /// something may have changed. Returns when stdout is closed.
    fn follow(&self, mut wait: impl FnMut()) -> Result<()> {
        let stdout = std::io::stdout();
        let mut buf = Vec::new();
        loop {
            match self.read_new(&mut buf)? {
                Some(text) if !text.is_empty() => {
                    let mut out = stdout.lock();
                    match out.write_all(text).and_then(|_| out.flush()) {
                        Ok(()) => {}
                        // A reader that went away (`| head`) ends us quietly.
                        Err(e) if e.kind() == ErrorKind::BrokenPipe => return Ok(()),
                        Err(e) => return Err(e).context("cannot write to stdout"),
                    }
                }
                _ => wait(),
            }
        }
    }

    /// Reads what was appended since the last read, up to the last complete
    /// record, and marks it consumed. None while there is no trace file yet.
    fn read_new<'a>(&self, buf: &'a mut Vec<u8>) -> Result<Option<&'a [u8]>> {
        let Some(mut file) = self.store.open_trace_pipe()? else {
            return Ok(None);
        };
        let meta = file.metadata()?;
        let (mut offset, inode) = self.position();
        if inode != meta.ino() || offset > meta.len() {
            offset = 0;
        }
        buf.clear();
        file.seek(SeekFrom::Start(offset))?;
        file.read_to_end(buf).with_context(|| {
            format!(
                "cannot read the trace pipe of {}",
                self.store.dir().display()
            )
        })?;
        // Each record is one append, but a read may still race one: keep a
        // partial record for next time.
        let complete = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        // Written only on progress: the write is itself a change in the
        // directory we watch.
        if complete > 0 || self.position() != (offset, meta.ino()) {
            self.set_position(offset + complete as u64, meta.ino())?;
        }
        Ok(Some(&buf[..complete]))
    }
}

/// Changes in the store directory, through inotify; a plain sleep where
/// inotify is unavailable.
pub(crate) struct DirWatch {
    fd: i32,
}

impl DirWatch {
    /// Watches `store`; with none, waiting is a plain sleep.
    pub(crate) fn new_for(store: Option<&Store>) -> DirWatch {
        match store {
            Some(s) => DirWatch::new(s),
            None => DirWatch { fd: -1 },
        }
    }

    pub(crate) fn new(store: &Store) -> DirWatch {
        // SAFETY: plain system call wrapper.
        let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
        if fd >= 0 {
            let wd = store
                .watch(fd, libc::IN_MODIFY | libc::IN_CREATE | libc::IN_MOVED_TO)
                .unwrap_or(-1);
            if wd < 0 {
                // SAFETY: our own fd.
                unsafe { libc::close(fd) };
                return DirWatch { fd: -1 };
            }
        }
        DirWatch { fd }
    }

    pub(crate) fn wait(&self, timeout_ms: i32) {
        if self.fd < 0 {
            std::thread::sleep(std::time::Duration::from_millis(timeout_ms as u64));
            return;
        }
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, timeout_ms) } > 0 {
            let mut buf = [0u8; 4096];
            // Drain the events; which file changed does not matter.
            // SAFETY: reads into a local buffer from our non-blocking fd.
            while unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
    }
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: our own fd.
            unsafe { libc::close(self.fd) };
        }
    }
}
