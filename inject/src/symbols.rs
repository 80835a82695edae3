//! Where the target's dynamic loader entry points live in its address space:
//! the C library's file (as the target sees it), its dynamic symbols, and the
//! load bias taken from /proc/PID/maps.

use crate::error::{InjectError, Result};
use crate::procfs::Mapping;
use goblin::elf::{program_header::PT_LOAD, Elf};
use std::collections::HashMap;

const PAGE: u64 = 4096;

/// The functions a remote `dlopen` needs, as addresses in the target.
#[derive(Debug, Clone)]
pub(crate) struct LoaderEntry {
    /// `dlopen`, or glibc's private `__libc_dlopen_mode` on glibc < 2.34
    /// without libdl mapped (same two arguments).
    pub open: u64,
    pub open_name: &'static str,
    /// `dlerror`, when the same library exports it.
    pub error: Option<u64>,
}

/// Reads target memory (for checking that the file on disk is what is mapped).
pub(crate) type ReadMem<'a> = &'a dyn Fn(u64, &mut [u8]) -> std::io::Result<()>;

fn is_libc(name: &str) -> bool {
    name == "libc.so.6"
        || (name.starts_with("libc-2.") && name.ends_with(".so"))
        || (name.starts_with("ld-musl-") && name.ends_with(".so.1"))
}

fn is_libdl(name: &str) -> bool {
    name == "libdl.so.2" || (name.starts_with("libdl-2.") && name.ends_with(".so"))
}

/// True for code of the C library, its threads library and the dynamic loader,
/// where a thread may hold a lock (malloc's, the loader's) that `dlopen` takes.
pub(crate) fn is_runtime_library(name: &str) -> bool {
    is_libc(name)
        || is_libdl(name)
        || name.starts_with("libpthread")
        || name.starts_with("ld-linux")
}

/// Finds `dlopen` and `dlerror` for process `pid`, preferring the C library
/// (glibc >= 2.34 and musl export both), then libdl, then glibc's private
/// `__libc_dlopen_mode`.
pub(crate) fn find_loader(
    pid: i32,
    dir: &str,
    maps: &[Mapping],
    read: ReadMem,
) -> Result<LoaderEntry> {
    let libc = MappedElf::find(pid, dir, maps, is_libc)?.ok_or_else(|| InjectError::NoDlopen {
        pid,
        why: "no C library is mapped: a statically linked program cannot load libraries".into(),
    })?;
    let names = ["dlopen", "dlerror", "__libc_dlopen_mode"];
    let syms = libc.symbols(&names)?;
    let pick = |elf: &MappedElf, syms: &HashMap<&str, Symbol>, name: &str| -> Result<Option<u64>> {
        match syms.get(name) {
            Some(s) => elf.checked_address(*s, read).map(Some),
            None => Ok(None),
        }
    };
    if let Some(open) = pick(&libc, &syms, "dlopen")? {
        return Ok(LoaderEntry {
            open,
            open_name: "dlopen",
            error: pick(&libc, &syms, "dlerror")?,
        });
    }
    if let Some(libdl) = MappedElf::find(pid, dir, maps, is_libdl)? {
        let dl = libdl.symbols(&names)?;
        if let Some(open) = pick(&libdl, &dl, "dlopen")? {
            return Ok(LoaderEntry {
                open,
                open_name: "dlopen",
                error: pick(&libdl, &dl, "dlerror")?,
            });
        }
    }
    if let Some(open) = pick(&libc, &syms, "__libc_dlopen_mode")? {
        return Ok(LoaderEntry {
            open,
            open_name: "__libc_dlopen_mode",
            error: None,
        });
    }
    Err(InjectError::NoDlopen {
        pid,
        why: format!("{} exports no dlopen", libc.path),
    })
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    vaddr: u64,
    file_offset: u64,
}

struct MappedElf {
    pid: i32,
    /// The path as the target's maps name it.
    path: String,
    bias: u64,
    data: Vec<u8>,
}

impl MappedElf {
    /// The first object `wanted` accepts in `maps`, read as process `pid`
    /// sees it (`dir` is its /proc directory).
    fn find(
        pid: i32,
        dir: &str,
        maps: &[Mapping],
        wanted: fn(&str) -> bool,
    ) -> Result<Option<MappedElf>> {
        let Some(first) = maps
            .iter()
            .find(|m| m.path.starts_with('/') && wanted(m.file_name()))
        else {
            return Ok(None);
        };
        let path = first.path.clone();
        let mine: Vec<&Mapping> = maps.iter().filter(|m| m.path == path).collect();
        let elf_err = |why: String| InjectError::Elf {
            pid,
            path: path.clone(),
            why,
        };
        // The mapped file itself, even when replaced on disk since (needs
        // CAP_SYS_ADMIN); else the path as seen from the target's root.
        let data = std::fs::read(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            first.start, first.end
        ))
        .or_else(|_| {
            let on_disk = path.strip_suffix(" (deleted)").unwrap_or(&path);
            std::fs::read(format!("{dir}/root{on_disk}"))
        })
        .map_err(|e| elf_err(e.to_string()))?;
        let elf = Elf::parse(&data).map_err(|e| elf_err(e.to_string()))?;
        let bias = mine
            .iter()
            .find_map(|m| {
                elf.program_headers
                    .iter()
                    .filter(|ph| ph.p_type == PT_LOAD)
                    .find(|ph| ph.p_offset & !(PAGE - 1) == m.offset)
                    .map(|ph| (m.start as u64).wrapping_sub(ph.p_vaddr & !(PAGE - 1)))
            })
            .ok_or_else(|| elf_err("no mapping matches its loadable segments".into()))?;
        Ok(Some(MappedElf {
            pid,
            path,
            bias,
            data,
        }))
    }

    fn symbols<'n>(&self, names: &[&'n str]) -> Result<HashMap<&'n str, Symbol>> {
        let elf = Elf::parse(&self.data).map_err(|e| InjectError::Elf {
            pid: self.pid,
            path: self.path.clone(),
            why: e.to_string(),
        })?;
        let mut found = HashMap::new();
        for sym in elf.dynsyms.iter() {
            if sym.st_shndx == 0 || !sym.is_function() {
                continue;
            }
            let Some(name) = elf.dynstrtab.get_at(sym.st_name) else {
                continue;
            };
            let Some(&wanted) = names.iter().find(|n| **n == name) else {
                continue;
            };
            let file_offset = elf
                .program_headers
                .iter()
                .filter(|ph| ph.p_type == PT_LOAD)
                .find(|ph| (ph.p_vaddr..ph.p_vaddr + ph.p_filesz).contains(&sym.st_value))
                .map(|ph| sym.st_value - ph.p_vaddr + ph.p_offset);
            if let Some(file_offset) = file_offset {
                found.entry(wanted).or_insert(Symbol {
                    vaddr: sym.st_value,
                    file_offset,
                });
            }
        }
        Ok(found)
    }

    /// The symbol's address in the target, after checking that the code there
    /// is the code in the file: calling into a library that was replaced on
    /// disk since the process mapped it would jump into the middle of nowhere.
    fn checked_address(&self, sym: Symbol, read: ReadMem) -> Result<u64> {
        let addr = self.bias.wrapping_add(sym.vaddr);
        let start = sym.file_offset as usize;
        let expected = self
            .data
            .get(start..start + 16)
            .ok_or_else(|| InjectError::Elf {
                pid: self.pid,
                path: self.path.clone(),
                why: "symbol lies past the end of the file".into(),
            })?;
        let mut seen = [0u8; 16];
        read(addr, &mut seen).map_err(|source| InjectError::Os {
            pid: self.pid,
            what: "read the dynamic loader's code",
            source,
        })?;
        if seen != expected {
            return Err(InjectError::LibcChanged {
                pid: self.pid,
                path: self.path.clone(),
            });
        }
        Ok(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names() {
        assert!(is_libc("libc.so.6"));
        assert!(is_libc("libc-2.31.so"));
        assert!(is_libc("ld-musl-x86_64.so.1"));
        assert!(!is_libc("libcurl.so.4"));
        assert!(!is_libc("libc++.so.1"));
        assert!(is_libdl("libdl.so.2"));
        assert!(is_runtime_library("ld-linux-x86-64.so.2"));
        assert!(is_runtime_library("libpthread.so.0"));
        assert!(!is_runtime_library("libstdc++.so.6"));
    }

    #[test]
    fn finds_dlopen_in_this_process() {
        let maps = crate::procfs::read_maps("/proc/self").unwrap();
        let read = |addr: u64, buf: &mut [u8]| -> std::io::Result<()> {
            // SAFETY: the address was resolved to mapped code of this process's libc.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len())
            };
            Ok(())
        };
        let entry = find_loader(std::process::id() as i32, "/proc/self", &maps, &read).unwrap();
        let name = std::ffi::CString::new(entry.open_name).unwrap();
        // SAFETY: dlsym with a valid C string; RTLD_DEFAULT searches the global scope.
        let real = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as u64;
        assert_eq!(entry.open, real);
        // SAFETY: as above.
        let real_err = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"dlerror".as_ptr()) } as u64;
        assert_eq!(entry.error, Some(real_err));
    }
}
