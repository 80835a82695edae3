//! CUDA fatbins: what the driver is handed when a program loads its device code.
//!
//! An image given to `cuModuleLoadData`, `cuLibraryLoadData` and friends is one of:
//! - a *fatbin wrapper* (magic [`WRAPPER_MAGIC`]), the 24-byte struct nvcc puts in
//!   `.nvFatBinSegment`: `{ u32 magic, u32 version, const void *data, const void *unused }`,
//!   with `data` pointing at a fatbin;
//! - a *fatbin*: one or more containers (magic [`CONTAINER_MAGIC`]) back to back, each a
//!   16-byte header `{ u32 magic, u16 version, u16 header_size, u64 entries_size }`
//!   followed by its entries;
//! - PTX text, NUL-terminated;
//! - a cubin (an ELF file).
//!
//! Each fatbin entry has its own header (at least [`ENTRY_HEADER_MIN`] bytes):
//!
//! | offset | field |
//! |---|---|
//! | 0 | u16 kind: 1 PTX, 2 cubin |
//! | 4 | u32 header size |
//! | 8 | u64 payload size (padded) |
//! | 16 | u32 compressed size (the payload's bytes that matter, when compressed) |
//! | 24 | u16 minor, u16 major: the PTX ISA version of a PTX entry |
//! | 28 | u32 arch: 90 for sm_90 / compute_90 |
//! | 40 | u64 flags: [`FLAG_ZSTD`] and [`FLAG_LEGACY_COMPRESSED`] say how the payload is packed |
//! | 56 | u64 decompressed size |
//!
//! nvcc 13 compresses PTX with ZSTD by default (docs/ARCHITECTURE.md decision 7).

use std::borrow::Cow;

use thiserror::Error;

/// First word of a fatbin wrapper.
pub const WRAPPER_MAGIC: u32 = 0x466243b1;
/// First word of a fatbin container.
pub const CONTAINER_MAGIC: u32 = 0xba55_ed50;
/// First word of a ZSTD frame.
const ZSTD_MAGIC: u32 = 0xfd2f_b528;

const CONTAINER_HEADER: usize = 16;
/// The fields this module reads, up to the decompressed size.
pub const ENTRY_HEADER_MIN: usize = 64;

/// The payload is one ZSTD frame (nvcc 13's default).
pub const FLAG_ZSTD: u64 = 0x8000;
/// The payload uses the compression of CUDA 11 and 12 (`-Xfatbin -compress-all`).
pub const FLAG_LEGACY_COMPRESSED: u64 = 0x2000;

/// Largest image taken from a raw pointer: a guard against a corrupt size field
/// sending the copy through the whole address space.
pub const MAX_IMAGE: usize = 1 << 30;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum FatbinError {
    #[error("the fatbin ends at byte {at}, inside {what}")]
    Truncated { what: &'static str, at: usize },
    #[error(
        "no fatbin container at byte {at} (magic {magic:#010x}, expected {CONTAINER_MAGIC:#010x})"
    )]
    BadMagic { at: usize, magic: u32 },
    #[error("fatbin entry at byte {at} has a {size}-byte header, shorter than the {ENTRY_HEADER_MIN} bytes its fields take")]
    ShortEntryHeader { at: usize, size: u32 },
    #[error("the {what} entry for sm_{arch} is compressed with CUDA 11/12's scheme (flag 0x2000), which bpftime cannot read: rebuild with nvcc 13, or with `-Xfatbin -compress-all=false`")]
    LegacyCompression { what: &'static str, arch: u32 },
    #[error("the {what} entry for sm_{arch} does not decompress: {reason}")]
    Decompress {
        what: &'static str,
        arch: u32,
        reason: String,
    },
    #[error("the image is not a fatbin, PTX or a cubin (first word {0:#010x})")]
    UnknownImage(u32),
    #[error("the {what} claims {size} bytes, more than the {MAX_IMAGE}-byte limit")]
    TooLarge { what: &'static str, size: u64 },
}

/// What a fatbin entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Ptx,
    Cubin,
    Other(u16),
}

impl EntryKind {
    fn name(self) -> &'static str {
        match self {
            EntryKind::Ptx => "PTX",
            EntryKind::Cubin => "cubin",
            EntryKind::Other(_) => "unknown",
        }
    }
}

/// One entry of a fatbin container, borrowed from the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub kind: EntryKind,
    /// The SM version: 90 for `sm_90` (cubin) or `compute_90` (PTX).
    pub arch: u32,
    /// The PTX ISA version of a PTX entry, `(major, minor)`.
    pub ptx_version: (u16, u16),
    pub flags: u64,
    /// The payload as stored (compressed or not), without padding where the header says
    /// how long the compressed data is.
    pub payload: &'a [u8],
    pub decompressed_size: u64,
}

impl Entry<'_> {
    /// The entry's contents, decompressed. PTX keeps whatever trailing NULs it was
    /// stored with; [`Entry::ptx_text`] drops them.
    pub fn contents(&self) -> Result<Cow<'_, [u8]>, FatbinError> {
        if self.flags & FLAG_ZSTD != 0 {
            if self.decompressed_size > MAX_IMAGE as u64 {
                return Err(FatbinError::TooLarge {
                    what: "decompressed entry",
                    size: self.decompressed_size,
                });
            }
            return zstd_decode(self.payload, self.decompressed_size as usize)
                .map(Cow::Owned)
                .map_err(|reason| FatbinError::Decompress {
                    what: self.kind.name(),
                    arch: self.arch,
                    reason,
                });
        }
        if self.flags & FLAG_LEGACY_COMPRESSED != 0 {
            return Err(FatbinError::LegacyCompression {
                what: self.kind.name(),
                arch: self.arch,
            });
        }
        Ok(Cow::Borrowed(self.payload))
    }

    /// The PTX text of a PTX entry, decompressed, without trailing NULs.
    pub fn ptx_text(&self) -> Result<String, FatbinError> {
        let bytes = self.contents()?;
        let end = bytes
            .iter()
            .rposition(|&b| b != 0)
            .map_or(0, |last| last + 1);
        Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
    }
}

fn zstd_decode(payload: &[u8], expected: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    if payload.len() < 4
        || u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) != ZSTD_MAGIC
    {
        return Err("the payload is flagged ZSTD but does not start with a ZSTD frame".into());
    }
    let mut decoder =
        ruzstd::decoding::StreamingDecoder::new(payload).map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(expected);
    decoder.read_to_end(&mut out).map_err(|e| e.to_string())?;
    if expected != 0 && out.len() != expected {
        return Err(format!(
            "{} bytes came out where the header says {expected}",
            out.len()
        ));
    }
    Ok(out)
}

fn u16_at(b: &[u8], at: usize, what: &'static str) -> Result<u16, FatbinError> {
    b.get(at..at + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or(FatbinError::Truncated { what, at })
}

fn u32_at(b: &[u8], at: usize, what: &'static str) -> Result<u32, FatbinError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or(FatbinError::Truncated { what, at })
}

fn u64_at(b: &[u8], at: usize, what: &'static str) -> Result<u64, FatbinError> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or(FatbinError::Truncated { what, at })
}

/// The bytes one container at the start of `bytes` takes, header included.
pub fn container_len(bytes: &[u8]) -> Result<usize, FatbinError> {
    let magic = u32_at(bytes, 0, "a container header")?;
    if magic != CONTAINER_MAGIC {
        return Err(FatbinError::BadMagic { at: 0, magic });
    }
    let header = u16_at(bytes, 6, "a container header")? as usize;
    let entries = u64_at(bytes, 8, "a container header")?;
    if entries > MAX_IMAGE as u64 {
        return Err(FatbinError::TooLarge {
            what: "fatbin container",
            size: entries,
        });
    }
    Ok(header.max(CONTAINER_HEADER) + entries as usize)
}

/// Every entry of the containers in `bytes`, in order. Trailing zero padding after the
/// last container is allowed (sections are padded).
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry<'_>>, FatbinError> {
    let mut entries = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at..].iter().all(|&b| b == 0) {
            break;
        }
        let rest = &bytes[at..];
        let magic = u32_at(rest, 0, "a container header").map_err(|_| FatbinError::Truncated {
            what: "a container header",
            at,
        })?;
        if magic != CONTAINER_MAGIC {
            return Err(FatbinError::BadMagic { at, magic });
        }
        let len = container_len(rest)?;
        if len > rest.len() {
            return Err(FatbinError::Truncated {
                what: "a container's entries",
                at: bytes.len(),
            });
        }
        let header = u16_at(rest, 6, "a container header")?.max(CONTAINER_HEADER as u16) as usize;
        parse_entries(&rest[header..len], at + header, &mut entries)?;
        at += len;
        // Containers are 8-byte aligned one after the other.
        at = (at + 7) & !7;
    }
    Ok(entries)
}

fn parse_entries<'a>(
    mut b: &'a [u8],
    mut at: usize,
    out: &mut Vec<Entry<'a>>,
) -> Result<(), FatbinError> {
    while !b.is_empty() {
        let truncated = |field_at: usize| FatbinError::Truncated {
            what: "an entry header",
            at: at + field_at,
        };
        let kind = u16_at(b, 0, "").map_err(|_| truncated(0))?;
        let header = u32_at(b, 4, "").map_err(|_| truncated(4))?;
        if (header as usize) < ENTRY_HEADER_MIN {
            return Err(FatbinError::ShortEntryHeader { at, size: header });
        }
        let size = u64_at(b, 8, "").map_err(|_| truncated(8))?;
        if size > MAX_IMAGE as u64 {
            return Err(FatbinError::TooLarge {
                what: "fatbin entry",
                size,
            });
        }
        let compressed = u32_at(b, 16, "").map_err(|_| truncated(16))?;
        let minor = u16_at(b, 24, "").map_err(|_| truncated(24))?;
        let major = u16_at(b, 26, "").map_err(|_| truncated(26))?;
        let arch = u32_at(b, 28, "").map_err(|_| truncated(28))?;
        let flags = u64_at(b, 40, "").map_err(|_| truncated(40))?;
        let decompressed_size = u64_at(b, 56, "").map_err(|_| truncated(56))?;
        let start = header as usize;
        let end = start + size as usize;
        if end > b.len() {
            return Err(FatbinError::Truncated {
                what: "an entry's payload",
                at: at + b.len(),
            });
        }
        let compressed_flags = FLAG_ZSTD | FLAG_LEGACY_COMPRESSED;
        let stored = if flags & compressed_flags != 0 && compressed != 0 {
            (compressed as usize).min(size as usize)
        } else {
            size as usize
        };
        out.push(Entry {
            kind: match kind {
                1 => EntryKind::Ptx,
                2 => EntryKind::Cubin,
                k => EntryKind::Other(k),
            },
            arch,
            ptx_version: (major, minor),
            flags,
            payload: &b[start..start + stored],
            decompressed_size,
        });
        b = &b[end..];
        at += end;
    }
    Ok(())
}

/// The PTX to instrument for a device of compute capability `device_sm` (90 for an
/// H100): the newest PTX entry not newer than the device, as the driver itself chooses
/// when it must JIT. `None` when there is none (a cubin-only fatbin, or PTX only for
/// newer devices).
pub fn select_ptx<'e, 'a>(entries: &'e [Entry<'a>], device_sm: u32) -> Option<&'e Entry<'a>> {
    entries
        .iter()
        .filter(|e| e.kind == EntryKind::Ptx && e.arch <= device_sm)
        .max_by_key(|e| (e.arch, e.ptx_version))
}

/// A driver image, copied out of the caller's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// Fatbin containers (the wrapper, if any, already followed).
    Fatbin(Vec<u8>),
    /// PTX text, without its NUL.
    Ptx(String),
    /// An ELF cubin: machine code only, nothing to instrument.
    Cubin(Vec<u8>),
}

impl Image {
    /// Classifies and copies the image at `ptr`, reading only as far as its own headers
    /// say it extends.
    ///
    /// # Safety
    /// `ptr` must be what the driver API accepts as an image: a fatbin wrapper, fatbin,
    /// NUL-terminated PTX or an ELF cubin, readable for the length its headers give.
    pub unsafe fn from_ptr(ptr: *const u8) -> Result<Image, FatbinError> {
        // SAFETY: every image kind is at least 4 bytes (PTX: some text and its NUL, which
        // a 4-byte read can overrun only for a PTX of under 3 characters, not a module).
        let magic = unsafe { std::ptr::read_unaligned(ptr.cast::<u32>()) };
        match magic {
            WRAPPER_MAGIC => {
                // SAFETY: a wrapper is { u32, u32, *const u8, *const u8 }.
                let data = unsafe { std::ptr::read_unaligned(ptr.add(8).cast::<*const u8>()) };
                // SAFETY: the wrapper's data is a fatbin (caller obligation).
                unsafe { Self::containers_from_ptr(data) }
            }
            CONTAINER_MAGIC => {
                // SAFETY: caller obligation.
                unsafe { Self::containers_from_ptr(ptr) }
            }
            0x464c_457f => {
                // SAFETY: an ELF header is 64 bytes; the section table ends the file
                // as cubins are written.
                let header = unsafe { std::slice::from_raw_parts(ptr, 64) };
                let shoff = u64_at(header, 0x28, "the ELF header")?;
                let shentsize = u16_at(header, 0x3a, "the ELF header")? as u64;
                let shnum = u16_at(header, 0x3c, "the ELF header")? as u64;
                let len = shoff + shentsize * shnum;
                if len > MAX_IMAGE as u64 {
                    return Err(FatbinError::TooLarge {
                        what: "cubin",
                        size: len,
                    });
                }
                // SAFETY: caller obligation: the whole ELF file is readable.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                Ok(Image::Cubin(bytes.to_vec()))
            }
            _ => {
                // SAFETY: anything else the driver takes is NUL-terminated PTX.
                let text = unsafe { std::ffi::CStr::from_ptr(ptr.cast()) };
                let text = text.to_string_lossy();
                if looks_like_ptx(&text) {
                    Ok(Image::Ptx(text.into_owned()))
                } else {
                    Err(FatbinError::UnknownImage(magic))
                }
            }
        }
    }

    /// # Safety
    /// `ptr` must point at a fatbin container, readable for the length its header gives.
    unsafe fn containers_from_ptr(ptr: *const u8) -> Result<Image, FatbinError> {
        // SAFETY: a container header is 16 bytes (caller obligation).
        let header = unsafe { std::slice::from_raw_parts(ptr, CONTAINER_HEADER) };
        // One container per image: nvcc writes one per translation unit, each with its
        // own wrapper, and what follows it in memory is not the driver's to read.
        let len = container_len(header)?;
        // SAFETY: the container extends `len` bytes (its own header says so).
        Ok(Image::Fatbin(
            unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec(),
        ))
    }

    /// Classifies an image held in memory (a file passed to `cuModuleLoad`).
    pub fn from_bytes(bytes: &[u8]) -> Result<Image, FatbinError> {
        let magic = u32_at(bytes, 0, "an image")?;
        match magic {
            CONTAINER_MAGIC => Ok(Image::Fatbin(bytes.to_vec())),
            0x464c_457f => Ok(Image::Cubin(bytes.to_vec())),
            _ => {
                let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
                let text = String::from_utf8_lossy(&bytes[..end]);
                if looks_like_ptx(&text) {
                    Ok(Image::Ptx(text.into_owned()))
                } else {
                    Err(FatbinError::UnknownImage(magic))
                }
            }
        }
    }

    /// The PTX to instrument for a device of compute capability `device_sm`, with the
    /// architecture it was written for; `Ok(None)` when the image carries none that fits.
    pub fn ptx_for(&self, device_sm: u32) -> Result<Option<(String, u32)>, FatbinError> {
        match self {
            Image::Ptx(text) => Ok(Some((text.clone(), ptx_target(text).unwrap_or(0)))),
            Image::Cubin(_) => Ok(None),
            Image::Fatbin(bytes) => {
                let entries = parse(bytes)?;
                match select_ptx(&entries, device_sm) {
                    Some(e) => Ok(Some((e.ptx_text()?, e.arch))),
                    None => Ok(None),
                }
            }
        }
    }
}

/// Whether `text` reads as a PTX module: its first directive (after comments and
/// blank lines) is `.version`.
pub fn looks_like_ptx(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("//"))
        .is_some_and(|l| l.starts_with(".version"))
}

/// The `NN` of a module's `.target sm_NN`.
pub fn ptx_target(text: &str) -> Option<u32> {
    text.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(".target"))
        .and_then(|rest| {
            rest.split([' ', ',', '\t'])
                .find_map(|w| w.trim().strip_prefix("sm_"))
                .map(|v| v.trim_end_matches(|c: char| c.is_ascii_alphabetic()))
                .and_then(|v| v.parse().ok())
        })
}

/// A PTX entry copied out of an image, still compressed if it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPtx {
    pub arch: u32,
    pub ptx_version: (u16, u16),
    pub flags: u64,
    pub payload: Vec<u8>,
    pub decompressed_size: u64,
}

impl OwnedPtx {
    fn entry(&self) -> Entry<'_> {
        Entry {
            kind: EntryKind::Ptx,
            arch: self.arch,
            ptx_version: self.ptx_version,
            flags: self.flags,
            payload: &self.payload,
            decompressed_size: self.decompressed_size,
        }
    }
}

/// What of a module image can be instrumented: its PTX entries, copied (and nothing
/// of its cubins, which can run to hundreds of megabytes in libraries like cuBLAS and
/// carry nothing to instrument).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModulePtx {
    pub entries: Vec<OwnedPtx>,
    /// How many machine-code entries the image had.
    pub cubins: usize,
}

impl ModulePtx {
    /// The PTX entries of a fatbin's `entries`, copied out, with a count of the machine-code ones.
    pub fn from_entries(entries: &[Entry<'_>]) -> ModulePtx {
        ModulePtx {
            entries: entries
                .iter()
                .filter(|e| e.kind == EntryKind::Ptx)
                .map(|e| OwnedPtx {
                    arch: e.arch,
                    ptx_version: e.ptx_version,
                    flags: e.flags,
                    payload: e.payload.to_vec(),
                    decompressed_size: e.decompressed_size,
                })
                .collect(),
            cubins: entries.iter().filter(|e| e.kind != EntryKind::Ptx).count(),
        }
    }

    fn from_text(text: String) -> ModulePtx {
        let arch = ptx_target(&text).unwrap_or(0);
        ModulePtx {
            entries: vec![OwnedPtx {
                arch,
                ptx_version: (0, 0),
                flags: 0,
                decompressed_size: text.len() as u64,
                payload: text.into_bytes(),
            }],
            cubins: 0,
        }
    }

    /// The PTX of the image at `ptr`, as the driver would be handed it.
    ///
    /// # Safety
    /// As [`Image::from_ptr`].
    pub unsafe fn from_image_ptr(ptr: *const u8) -> Result<ModulePtx, FatbinError> {
        // SAFETY: caller obligation, as for Image::from_ptr.
        let magic = unsafe { std::ptr::read_unaligned(ptr.cast::<u32>()) };
        let container = match magic {
            // SAFETY: a wrapper is { u32, u32, *const u8, *const u8 }.
            WRAPPER_MAGIC => unsafe { std::ptr::read_unaligned(ptr.add(8).cast::<*const u8>()) },
            CONTAINER_MAGIC => ptr,
            0x464c_457f => {
                return Ok(ModulePtx {
                    entries: Vec::new(),
                    cubins: 1,
                })
            }
            _ => {
                // SAFETY: caller obligation (NUL-terminated PTX).
                return match unsafe { Image::from_ptr(ptr) }? {
                    Image::Ptx(text) => Ok(ModulePtx::from_text(text)),
                    _ => Err(FatbinError::UnknownImage(magic)),
                };
            }
        };
        // SAFETY: a container header is 16 bytes (caller obligation).
        let header = unsafe { std::slice::from_raw_parts(container, CONTAINER_HEADER) };
        let len = container_len(header)?;
        // SAFETY: the container extends `len` bytes (its own header says so); borrowed
        // only for this call.
        let bytes = unsafe { std::slice::from_raw_parts(container, len) };
        Ok(ModulePtx::from_entries(&parse(bytes)?))
    }

    /// The PTX of an image held in memory (a file given to `cuModuleLoad`).
    pub fn from_bytes(bytes: &[u8]) -> Result<ModulePtx, FatbinError> {
        match Image::from_bytes(bytes)? {
            Image::Ptx(text) => Ok(ModulePtx::from_text(text)),
            Image::Cubin(_) => Ok(ModulePtx {
                entries: Vec::new(),
                cubins: 1,
            }),
            Image::Fatbin(b) => Ok(ModulePtx::from_entries(&parse(&b)?)),
        }
    }

    /// The PTX to instrument for a device of compute capability `device_sm`, as
    /// [`select_ptx`] chooses, decompressed, with the architecture it was written for.
    pub fn ptx_for(&self, device_sm: u32) -> Result<Option<(String, u32)>, FatbinError> {
        let entries: Vec<Entry<'_>> = self.entries.iter().map(OwnedPtx::entry).collect();
        // A lone PTX module with an unknown target is the driver's to judge.
        if let [only] = entries.as_slice() {
            if only.arch == 0 {
                return Ok(Some((only.ptx_text()?, 0)));
            }
        }
        match select_ptx(&entries, device_sm) {
            Some(e) => Ok(Some((e.ptx_text()?, e.arch))),
            None => Ok(None),
        }
    }
}
