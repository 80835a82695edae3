//! From `binary:symbol` or `binary:offset` to an address in this process.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use goblin::elf::program_header::PT_LOAD;
use goblin::elf::section_header::SHN_UNDEF;
use goblin::elf::sym::STT_FUNC;
use goblin::elf::Elf;

use crate::error::AttachError;
use crate::maps::{self, Mapping};

/// An attach point: a binary and a place in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// A path, or a bare file name (`libc.so.6`) looked up among the files mapped in this
    /// process.
    pub binary: PathBuf,
    pub location: Location,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A symbol from `.symtab` or `.dynsym`; `name@VERSION` and `name@@VERSION` match by name.
    Symbol(String),
    /// A file offset, as the kernel's uprobe `offset`.
    Offset(u64),
}

impl FromStr for Target {
    type Err = AttachError;

    /// `binary:symbol`, `binary:0x1a2b` or `binary:6699`. The last `:` splits, since symbols
    /// never hold one and paths rarely do.
    fn from_str(s: &str) -> Result<Self, AttachError> {
        let bad = |reason| AttachError::BadTarget {
            target: s.to_owned(),
            reason,
        };
        let (binary, place) = s.rsplit_once(':').ok_or_else(|| bad("no `:`"))?;
        if binary.is_empty() {
            return Err(bad("empty binary"));
        }
        if place.is_empty() {
            return Err(bad("empty symbol or offset"));
        }
        let location = if let Some(hex) = place
            .strip_prefix("0x")
            .or_else(|| place.strip_prefix("0X"))
        {
            Location::Offset(
                u64::from_str_radix(hex, 16).map_err(|_| bad("bad hexadecimal offset"))?,
            )
        } else if place.bytes().all(|b| b.is_ascii_digit()) {
            Location::Offset(place.parse().map_err(|_| bad("offset out of range"))?)
        } else {
            Location::Symbol(place.to_owned())
        };
        Ok(Target {
            binary: PathBuf::from(binary),
            location,
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.location {
            Location::Symbol(s) => write!(f, "{}:{s}", self.binary.display()),
            Location::Offset(o) => write!(f, "{}:{o:#x}", self.binary.display()),
        }
    }
}

impl Target {
    /// The file offset of this target in its binary.
    pub fn file_offset(&self) -> Result<u64, AttachError> {
        match &self.location {
            Location::Symbol(s) => symbol_file_offset(&self.binary, s),
            Location::Offset(o) => Ok(*o),
        }
    }

    /// The address of this target in this process.
    pub fn resolve(&self) -> Result<usize, AttachError> {
        runtime_address(&self.binary, self.file_offset()?)
    }
}

/// A path as given, or, for a bare file name (no `/`), the path of the mapped file of that
/// name in this process.
pub fn resolve_binary(binary: &Path) -> Result<PathBuf, AttachError> {
    let name = binary.to_str().filter(|s| !s.contains('/'));
    let Some(name) = name else {
        return Ok(binary.to_path_buf());
    };
    let maps = read_maps(binary)?;
    maps::find_by_file_name(&maps, name).ok_or_else(|| AttachError::NotMapped {
        binary: binary.to_path_buf(),
    })
}

/// Runs `f` on the parsed ELF file `binary` (found as [`resolve_binary`] does).
pub(crate) fn with_elf<T>(
    binary: &Path,
    f: impl FnOnce(&Path, &[u8], &Elf<'_>) -> Result<T, AttachError>,
) -> Result<T, AttachError> {
    let path = resolve_binary(binary)?;
    let read_error = |source| AttachError::Read {
        path: path.clone(),
        source,
    };
    let file = std::fs::File::open(&path).map_err(read_error)?;
    // Mapped, not read: libraries like libcuda or libtorch run to hundreds of megabytes.
    // SAFETY: read-only and dropped before we return. Truncating the file meanwhile would
    // fault (SIGBUS); binaries we attach to are loaded and replaced by rename, not in place.
    let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(read_error)?;
    let elf = Elf::parse(&bytes).map_err(|e| AttachError::Elf {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    f(&path, &bytes, &elf)
}

/// The virtual address that file offset `file_offset` gets from the `PT_LOAD` segment that
/// holds it.
pub(crate) fn vaddr_of(elf: &Elf<'_>, file_offset: u64) -> Option<u64> {
    elf.program_headers
        .iter()
        .filter(|ph| ph.p_type == PT_LOAD)
        .find(|ph| file_offset >= ph.p_offset && file_offset - ph.p_offset < ph.p_filesz)
        .map(|ph| file_offset - ph.p_offset + ph.p_vaddr)
}

/// Whether file offset `file_offset` of `binary` is where a function starts: the address a
/// `PT_LOAD` segment gives it is the value of a function symbol (in `.symtab` or
/// `.dynsym`). A stripped binary has no such answer past its exported functions, and says
/// no.
pub fn is_function_entry(binary: &Path, file_offset: u64) -> Result<bool, AttachError> {
    with_elf(binary, |_, _, elf| {
        let Some(vaddr) = vaddr_of(elf, file_offset) else {
            return Ok(false);
        };
        let starts_here = |sym: goblin::elf::Sym| {
            sym.st_type() == STT_FUNC && sym.st_shndx != SHN_UNDEF as usize && sym.st_value == vaddr
        };
        Ok(elf.syms.iter().any(starts_here) || elf.dynsyms.iter().any(starts_here))
    })
}

/// The file offset of `symbol` in `binary`, computed as libbpf does for uprobes: the symbol's
/// virtual address, moved through the `PT_LOAD` segment that holds it.
pub fn symbol_file_offset(binary: &Path, symbol: &str) -> Result<u64, AttachError> {
    with_elf(binary, |path, _, elf| symbol_offset_in(path, elf, symbol))
}

fn symbol_offset_in(path: &Path, elf: &Elf<'_>, symbol: &str) -> Result<u64, AttachError> {
    let path = path.to_path_buf();
    let not_found = || AttachError::SymbolNotFound {
        binary: path.clone(),
        symbol: symbol.to_owned(),
    };
    let vaddr = find_symbol(elf, symbol).ok_or_else(not_found)?;
    elf.program_headers
        .iter()
        .filter(|ph| ph.p_type == PT_LOAD)
        .find(|ph| vaddr >= ph.p_vaddr && vaddr - ph.p_vaddr < ph.p_filesz)
        .map(|ph| vaddr - ph.p_vaddr + ph.p_offset)
        .ok_or_else(|| AttachError::NotInSegment {
            binary: path.clone(),
            symbol: symbol.to_owned(),
            vaddr,
        })
}

/// How well a symbol's name matches what was asked for; lower is better.
fn match_rank(wanted: &str, name: &str, default_version: bool) -> Option<u8> {
    if name == wanted {
        return Some(0);
    }
    let base = |s: &str| s.split_once('@').map_or(s, |(b, _)| b).to_owned();
    if base(name) != base(wanted) {
        return None;
    }
    Some(if default_version { 1 } else { 2 })
}

fn find_symbol(elf: &Elf<'_>, wanted: &str) -> Option<u64> {
    let mut best: Option<(u8, u64)> = None;
    let mut consider = |rank: Option<u8>, value: u64| {
        if let Some(rank) = rank {
            if best.is_none_or(|(r, _)| rank < r) {
                best = Some((rank, value));
            }
        }
    };
    for sym in elf
        .syms
        .iter()
        .filter(|s| s.st_shndx != SHN_UNDEF as usize && s.st_value != 0)
    {
        let Some(name) = elf.strtab.get_at(sym.st_name) else {
            continue;
        };
        // In .symtab the default version is spelled `@@`; a lone `@` is an old version.
        let default_version = !name.contains('@') || name.contains("@@");
        consider(match_rank(wanted, name, default_version), sym.st_value);
    }
    for (i, sym) in elf.dynsyms.iter().enumerate() {
        if sym.st_shndx == SHN_UNDEF as usize || sym.st_value == 0 {
            continue;
        }
        let Some(name) = elf.dynstrtab.get_at(sym.st_name) else {
            continue;
        };
        let hidden = elf
            .versym
            .as_ref()
            .and_then(|v| v.get_at(i))
            .is_some_and(|v| v.is_hidden());
        consider(match_rank(wanted, name, !hidden), sym.st_value);
    }
    best.map(|(_, v)| v)
}

fn read_maps(binary: &Path) -> Result<Vec<Mapping>, AttachError> {
    maps::read_self().map_err(|source| AttachError::Read { path: PathBuf::from("/proc/self/maps"), source })
        .inspect(|m| tracing::trace!(binary = %binary.display(), mappings = m.len(), "read /proc/self/maps"))
}

/// The address in this process of file offset `file_offset` of `binary`. The file is found
/// among this process's mappings by device and inode, or by path; when several mappings hold
/// the offset (segments that share a page), an executable one wins.
pub fn runtime_address(binary: &Path, file_offset: u64) -> Result<usize, AttachError> {
    address_in_mapping(binary, file_offset, |m| m.exec, false)
}

/// As [`runtime_address`] for writable data (a USDT semaphore): only a writable mapping
/// counts, since the page a data segment shares with code is mapped twice and only the
/// writable copy is the one the program reads.
pub fn runtime_data_address(binary: &Path, file_offset: u64) -> Result<usize, AttachError> {
    address_in_mapping(binary, file_offset, |m| m.writable, true)
}

fn address_in_mapping(
    binary: &Path,
    file_offset: u64,
    preferred: impl Fn(&Mapping) -> bool,
    only_preferred: bool,
) -> Result<usize, AttachError> {
    let path = resolve_binary(binary)?;
    let maps = read_maps(&path)?;
    let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    let id = std::fs::metadata(&canonical).ok().map(|m| {
        let dev = m.dev();
        ((libc::major(dev), libc::minor(dev)), m.ino())
    });
    let same_file = |m: &&Mapping| {
        m.file_path().is_some_and(|p| p == canonical || p == path)
            || id.is_some_and(|(dev, ino)| m.dev == dev && m.inode == ino && m.inode != 0)
    };
    let mine: Vec<&Mapping> = maps.iter().filter(same_file).collect();
    if mine.is_empty() {
        return Err(AttachError::NotMapped { binary: path });
    }
    let holding = |wanted: bool| {
        mine.iter()
            .filter(|m| preferred(m) == wanted)
            .find_map(|m| m.address_of(file_offset))
    };
    holding(true)
        .or_else(|| if only_preferred { None } else { holding(false) })
        .ok_or(AttachError::OffsetNotMapped {
            binary: path,
            offset: file_offset,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_symbols_and_offsets() {
        let t: Target = "/usr/lib/libc.so.6:malloc".parse().unwrap();
        assert_eq!(t.binary, PathBuf::from("/usr/lib/libc.so.6"));
        assert_eq!(t.location, Location::Symbol("malloc".into()));
        let t: Target = "libc.so.6:0x1A2b".parse().unwrap();
        assert_eq!(t.location, Location::Offset(0x1a2b));
        let t: Target = "/a:b/c:4096".parse().unwrap();
        assert_eq!(t.binary, PathBuf::from("/a:b/c"));
        assert_eq!(t.location, Location::Offset(4096));
        let t: Target = "x:malloc@@GLIBC_2.2.5".parse().unwrap();
        assert_eq!(t.location, Location::Symbol("malloc@@GLIBC_2.2.5".into()));
    }

    #[test]
    fn offsets_round_trip_through_display() {
        for s in ["/bin/ls:0x1a2b", "libc.so.6:0x0", "/a:b:0xffffffffffffffff"] {
            let t: Target = s.parse().unwrap();
            assert_eq!(t.to_string(), s);
            assert_eq!(t.to_string().parse::<Target>().unwrap(), t);
        }
        let t: Target = "/bin/ls:100".parse().unwrap();
        assert_eq!(t.to_string(), "/bin/ls:0x64");
    }

    #[test]
    fn rejects_malformed_targets() {
        for s in [
            "nocolon",
            ":sym",
            "bin:",
            "bin:0xzz",
            "bin:99999999999999999999999",
        ] {
            assert!(
                matches!(s.parse::<Target>(), Err(AttachError::BadTarget { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn versioned_names_match_by_base_name_and_prefer_the_default() {
        assert_eq!(match_rank("malloc", "malloc", true), Some(0));
        assert_eq!(match_rank("malloc", "malloc@@GLIBC_2.2.5", true), Some(1));
        assert_eq!(match_rank("malloc@@GLIBC_2.2.5", "malloc", true), Some(1));
        assert_eq!(match_rank("memcpy", "memcpy@GLIBC_2.2.5", false), Some(2));
        assert_eq!(match_rank("malloc", "malloc_usable_size", true), None);
        assert_eq!(match_rank("mallo", "malloc", true), None);
    }
}
