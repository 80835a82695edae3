use std::path::PathBuf;
use thiserror::Error;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the store and its maps. Map operations carry the errno the kernel
/// would return for the same call, so the shim can hand it back unchanged.
#[derive(Debug, Error)]
pub enum Error {
    // The cause is in the message and not also a `source`: a report that prints the
    // chain (anyhow's `{:#}`) would say it twice.
    #[error("{op} {path}: {err}")]
    Io {
        op: &'static str,
        path: PathBuf,
        err: std::io::Error,
    },
    #[error("refusing the store directory {dir}: {why}; a store belongs to the one user who may write in it, so remove that directory (`rm -rf {dir}`) or choose another --store name")]
    Untrusted { dir: PathBuf, why: String },
    #[error("{path} is not a bpftime store object (bad magic {magic:#x})")]
    BadMagic { path: PathBuf, magic: u32 },
    #[error("{path} was written by store layout version {found}, this build reads version {expected}; remove the store with `bpftime list --clean` or use another `--store` name")]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("store `{name}` does not exist (looked in {dir}); start a loader with `bpftime load` first, or pass the same --store name")]
    NoStore { name: String, dir: PathBuf },
    #[error("{kind} {id} is not in the store")]
    NoObject { kind: &'static str, id: u32 },
    /// A map operation or an object refused, with the kernel's errno. The text is borrowed
    /// where it is fixed: programs' map calls fail on their hot path (a full map, a missing
    /// key), and must not allocate there (the C library's `malloc` may be locked over a
    /// `fork` the program watches).
    #[error("{what}")]
    Invalid {
        what: std::borrow::Cow<'static, str>,
        errno: i32,
    },
}

impl Error {
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            err: source,
        }
    }

    pub fn invalid(errno: i32, what: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        Error::Invalid {
            what: what.into(),
            errno,
        }
    }

    /// The errno the kernel would return for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { err, .. } => err.raw_os_error().unwrap_or(libc::EIO),
            Error::Untrusted { .. } => libc::EACCES,
            Error::BadMagic { .. } | Error::Version { .. } => libc::EINVAL,
            Error::NoStore { .. } | Error::NoObject { .. } => libc::ENOENT,
            Error::Invalid { errno, .. } => *errno,
        }
    }
}
