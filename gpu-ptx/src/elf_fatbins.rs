//! The PTX of kernels whose modules were loaded before GPU attach started (`bpftime
//! attach PID` into a CUDA process): the driver was handed their images before its entry
//! points were intercepted, so the images were never seen. What nvcc links into a program
//! or a shared library is still there, in the ELF objects the process has mapped:
//!
//! - `.nv_fatbin` holds the fatbin containers of every translation unit (cudart's own
//!   among them), back to back at 8-byte alignment;
//! - `.nvFatBinSegment` holds the fatbin wrappers (magic [`fatbin::WRAPPER_MAGIC`]) that
//!   cudart registers, each pointing at its container; a container a wrapper points at
//!   outside `.nv_fatbin` is found through it.
//!
//! [`scan_object`] lists an object's containers with the kernels of the PTX a device would
//! get from each ([`fatbin::select_ptx`]); GPU attach keeps that list per object (its
//! `FatbinIndex`), so each object is read once however many kernels are looked up;
//! [`read_container`] copies the PTX of the container a lookup chose. Everything here reads files, never the
//! process's memory: a kernel whose PTX lives only in memory (a driver-API program that
//! loaded it from a buffer) is not found.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use goblin::container::{Container as ElfClass, Ctx, Endian};
use goblin::elf::program_header::{ProgramHeader, PT_LOAD};
use goblin::elf::reloc::RelocSection;
use goblin::elf::section_header::{SectionHeader, SHT_RELA};
use goblin::elf::Elf;
use goblin::strtab::Strtab;
use thiserror::Error;

use crate::fatbin::{self, FatbinError, ModulePtx};
use crate::ptx;

/// The section of fatbin containers.
pub const FATBIN_SECTION: &str = ".nv_fatbin";
/// The section of fatbin wrappers.
pub const WRAPPER_SECTION: &str = ".nvFatBinSegment";
/// A fatbin wrapper: `{ u32 magic, u32 version, u64 data, u64 unused }`.
const WRAPPER_SIZE: usize = 24;
/// `R_X86_64_RELATIVE`: how a position-independent object's wrapper gets its pointer.
const R_X86_64_RELATIVE: u32 = 8;

#[derive(Debug, Error)]
pub enum ScanError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not an ELF object bpftime can read: {reason}")]
    Elf { path: PathBuf, reason: String },
    #[error("the fatbin at offset {offset:#x} of {path} is unreadable: {source}")]
    Fatbin {
        path: PathBuf,
        offset: u64,
        source: FatbinError,
    },
    #[error(
        "{path} changed since it was scanned: no fatbin container at offset {offset:#x} any more"
    )]
    Changed { path: PathBuf, offset: u64 },
}

/// One fatbin container of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    /// Where it starts in the file, and its length, header included.
    pub offset: u64,
    pub len: u64,
    /// The architecture of the PTX a device gets from it (`compute_75`: 75).
    pub arch: u32,
    /// The kernels (`.entry`) of that PTX, sorted.
    pub kernels: Vec<String>,
}

impl Container {
    pub fn has_kernel(&self, name: &str) -> bool {
        self.kernels
            .binary_search_by(|k| k.as_str().cmp(name))
            .is_ok()
    }
}

/// What [`scan_object`] found in one object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectFatbins {
    pub path: PathBuf,
    /// Containers with PTX for the device, in file order.
    pub containers: Vec<Container>,
    /// Containers with machine code only, or only PTX for newer devices.
    pub without_ptx: usize,
    /// Containers that could not be read, and why (kept for the log).
    pub unreadable: Vec<String>,
}

/// Opens `path` mapped, not read: libraries like libtorch_cuda run to gigabytes, of which
/// a scan touches the headers.
fn map_file(path: &Path) -> Result<memmap2::Mmap, ScanError> {
    let read = |source| ScanError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    // SAFETY: read-only and dropped before the caller returns. Truncating the file
    // meanwhile would fault (SIGBUS); the objects scanned are loaded ones, which are
    // replaced by rename, not rewritten in place.
    unsafe { memmap2::Mmap::map(&file) }.map_err(read)
}

/// The file ranges of every fatbin container of the ELF object `bytes`: those walked in
/// `.nv_fatbin`, then those a wrapper in `.nvFatBinSegment` points at elsewhere.
fn container_ranges(path: &Path, bytes: &[u8]) -> Result<Vec<(u64, u64)>, ScanError> {
    let bad = |reason: String| ScanError::Elf {
        path: path.to_path_buf(),
        reason,
    };
    let header = Elf::parse_header(bytes).map_err(|e| bad(e.to_string()))?;
    if header.e_ident[goblin::elf::header::EI_CLASS] != goblin::elf::header::ELFCLASS64
        || header.e_ident[goblin::elf::header::EI_DATA] != goblin::elf::header::ELFDATA2LSB
    {
        return Err(bad("not a 64-bit little-endian object".into()));
    }
    let ctx = Ctx::new(ElfClass::Big, Endian::Little);
    let sections =
        SectionHeader::parse(bytes, header.e_shoff as usize, header.e_shnum as usize, ctx)
            .map_err(|e| bad(format!("section headers: {e}")))?;
    let Some(names) = sections.get(header.e_shstrndx as usize) else {
        return Ok(Vec::new());
    };
    let names = Strtab::parse(bytes, names.sh_offset as usize, names.sh_size as usize, 0)
        .map_err(|e| bad(format!("section names: {e}")))?;
    let named = |name: &str| {
        sections
            .iter()
            .find(|s| names.get_at(s.sh_name) == Some(name))
    };
    let file_range = |s: &SectionHeader| -> Result<std::ops::Range<usize>, ScanError> {
        let (start, len) = (s.sh_offset as usize, s.sh_size as usize);
        start
            .checked_add(len)
            .filter(|&end| end <= bytes.len())
            .map(|end| start..end)
            .ok_or_else(|| {
                bad(format!(
                    "a section runs past the file's end ({start:#x}+{len:#x})"
                ))
            })
    };
    let mut ranges = Vec::new();
    if let Some(s) = named(FATBIN_SECTION) {
        let r = file_range(s)?;
        for (at, len) in walk_containers(&bytes[r.clone()]) {
            ranges.push(((r.start + at) as u64, len as u64));
        }
    }
    if let Some(s) = named(WRAPPER_SECTION) {
        let r = file_range(s)?;
        let segments =
            ProgramHeader::parse(bytes, header.e_phoff as usize, header.e_phnum as usize, ctx)
                .map_err(|e| bad(format!("program headers: {e}")))?;
        let loads: Vec<&ProgramHeader> = segments.iter().filter(|p| p.p_type == PT_LOAD).collect();
        let file_offset = |vaddr: u64| {
            loads
                .iter()
                .find(|p| vaddr >= p.p_vaddr && vaddr - p.p_vaddr < p.p_filesz)
                .map(|p| vaddr - p.p_vaddr + p.p_offset)
        };
        // A position-independent object's pointer is written by the loader; the link
        // editor leaves the value in the section too, or only in the relocation's addend.
        let mut relocated: Option<HashMap<u64, u64>> = None;
        for (i, w) in bytes[r].chunks_exact(WRAPPER_SIZE).enumerate() {
            if u32::from_le_bytes(w[0..4].try_into().expect("4 bytes")) != fatbin::WRAPPER_MAGIC {
                continue;
            }
            let mut data = u64::from_le_bytes(w[8..16].try_into().expect("8 bytes"));
            if data == 0 {
                let slot = s.sh_addr + (i * WRAPPER_SIZE) as u64 + 8;
                let relocs =
                    relocated.get_or_insert_with(|| relative_relocations(bytes, &sections, ctx));
                data = relocs.get(&slot).copied().unwrap_or(0);
            }
            let Some(at) = file_offset(data).filter(|_| data != 0) else {
                continue;
            };
            if ranges.iter().any(|&(o, _)| o == at) {
                continue;
            }
            if let Ok(len) = fatbin::container_len(&bytes[at as usize..]) {
                if at as usize + len <= bytes.len() {
                    ranges.push((at, len as u64));
                }
            }
        }
    }
    Ok(ranges)
}

/// Slot address to value of every `R_X86_64_RELATIVE` relocation in the object's
/// `SHT_RELA` sections.
fn relative_relocations(bytes: &[u8], sections: &[SectionHeader], ctx: Ctx) -> HashMap<u64, u64> {
    let mut out = HashMap::new();
    for s in sections.iter().filter(|s| s.sh_type == SHT_RELA) {
        let Ok(relocs) =
            RelocSection::parse(bytes, s.sh_offset as usize, s.sh_size as usize, true, ctx)
        else {
            continue;
        };
        for r in relocs.iter() {
            if r.r_type == R_X86_64_RELATIVE {
                out.insert(r.r_offset, r.r_addend.unwrap_or(0) as u64);
            }
        }
    }
    out
}

/// The containers laid back to back in a `.nv_fatbin` section, as (offset, length). Past
/// something that is not a container, the walk looks for the next one at the next 8-byte
/// boundary, so one odd container costs only itself.
fn walk_containers(section: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= section.len() {
        match fatbin::container_len(&section[at..]) {
            Ok(len) if at + len <= section.len() => {
                out.push((at, len));
                at = (at + len + 7) & !7;
            }
            _ => at += 8,
        }
    }
    out
}

/// The PTX a device of compute capability `sm` gets from the container `bytes`, and that
/// PTX's architecture; `None` for machine code only.
fn container_ptx(bytes: &[u8], sm: u32) -> Result<Option<(String, u32)>, FatbinError> {
    let entries = fatbin::parse(bytes)?;
    match fatbin::select_ptx(&entries, sm) {
        Some(e) => Ok(Some((e.ptx_text()?, e.arch))),
        None => Ok(None),
    }
}

/// Every fatbin container of the ELF object at `path` with PTX that a device of compute
/// capability `sm` (90 for an H100) can take, with the kernels that PTX defines. An object
/// without fatbins gives none; a container that cannot be read is skipped and noted.
pub fn scan_object(path: &Path, sm: u32) -> Result<ObjectFatbins, ScanError> {
    let bytes = map_file(path)?;
    let mut found = ObjectFatbins {
        path: path.to_path_buf(),
        ..ObjectFatbins::default()
    };
    for (offset, len) in container_ranges(path, &bytes)? {
        let c = &bytes[offset as usize..(offset + len) as usize];
        let ptx = container_ptx(c, sm).map_err(|e| e.to_string());
        let names = ptx.and_then(|p| match p {
            None => Ok(None),
            Some((text, arch)) => ptx::entry_names(&text)
                .map(|names| Some((names, arch)))
                .map_err(|e| e.to_string()),
        });
        match names {
            Ok(None) => found.without_ptx += 1,
            Ok(Some((mut kernels, arch))) => {
                kernels.sort();
                kernels.dedup();
                found.containers.push(Container {
                    offset,
                    len,
                    arch,
                    kernels,
                });
            }
            Err(e) => found
                .unreadable
                .push(format!("container at {offset:#x}: {e}")),
        }
    }
    Ok(found)
}

/// The PTX of container `c` of the object at `path`, as [`scan_object`] found it, copied
/// out of the file for GPU attach to keep.
pub fn read_container(path: &Path, c: &Container) -> Result<ModulePtx, ScanError> {
    let bytes = map_file(path)?;
    let changed = || ScanError::Changed {
        path: path.to_path_buf(),
        offset: c.offset,
    };
    let start = c.offset as usize;
    let end = start.checked_add(c.len as usize).ok_or_else(changed)?;
    let slice = bytes.get(start..end).ok_or_else(changed)?;
    if fatbin::container_len(slice).ok() != Some(slice.len()) {
        return Err(changed());
    }
    let entries = fatbin::parse(slice).map_err(|source| ScanError::Fatbin {
        path: path.to_path_buf(),
        offset: c.offset,
        source,
    })?;
    Ok(ModulePtx::from_entries(&entries))
}
