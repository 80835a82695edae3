//! Loads the relocatable ELF object LLVM emits into anonymous memory.
//!
//! The image is mapped read-write, filled and relocated, then turned read-execute in one
//! step: it is never writable and executable at once. Only what lifted code produces is
//! handled: code, read-only constants, PC-relative and absolute relocations, and calls to
//! the few libc functions LLVM may synthesize (memcpy, memset, memmove), reached through
//! stubs because libc lies beyond a 32-bit displacement.

use std::collections::BTreeMap;

use goblin::elf::section_header::{SHF_ALLOC, SHF_EXECINSTR, SHF_WRITE, SHT_NOBITS};
use goblin::elf::Elf;
use memmap2::{Mmap, MmapMut};
use tracing::trace;

use crate::JitError;

const R_X86_64_NONE: u32 = 0;
const R_X86_64_64: u32 = 1;
const R_X86_64_PC32: u32 = 2;
const R_X86_64_PLT32: u32 = 4;
const R_X86_64_GOTPCREL: u32 = 9;
const R_X86_64_32: u32 = 10;
const R_X86_64_32S: u32 = 11;
const R_X86_64_PC64: u32 = 24;
const R_X86_64_GOTPCRELX: u32 = 41;
const R_X86_64_REX_GOTPCRELX: u32 = 42;

const SHN_UNDEF: usize = 0;
const SHN_ABS: usize = 0xfff1;

/// `jmp *0(%rip)` followed by the 8-byte absolute target.
const STUB: [u8; 6] = [0xff, 0x25, 0, 0, 0, 0];
const STUB_SIZE: usize = 16;

/// Executable code loaded from one object.
pub(crate) struct LoadedCode {
    map: Mmap,
    entry: usize,
    /// Where the instructions are: (offset, size) of each executable section.
    code: Vec<(usize, usize)>,
    /// Whether the code calls into libc (memcpy and the like).
    calls_libc: bool,
}

impl LoadedCode {
    /// Whether the code leaves the vector registers as it found them: it uses none, and
    /// calls nothing outside itself but what the lifter counted in `plain_calls`.
    pub(crate) fn keeps_vector_registers(&self) -> bool {
        !self.calls_libc
            && self.code.iter().all(|&(off, size)| {
                !crate::vectors::touches_vector_registers(
                    &self.map[off..off + size],
                    self.map.as_ptr() as u64 + off as u64,
                )
            })
    }

    pub(crate) fn entry_address(&self) -> u64 {
        self.map.as_ptr() as u64 + self.entry as u64
    }

    pub(crate) fn size(&self) -> usize {
        self.map.len()
    }
}

fn external_address(name: &str) -> Option<u64> {
    let f = match name {
        "memcpy" => libc::memcpy as *const () as usize,
        "memmove" => libc::memmove as *const () as usize,
        "memset" => libc::memset as *const () as usize,
        _ => return None,
    };
    Some(f as u64)
}

fn align_up(v: usize, align: usize) -> usize {
    v.div_ceil(align) * align
}

pub(crate) fn load(obj: &[u8], entry_name: &str) -> Result<LoadedCode, JitError> {
    let elf = Elf::parse(obj).map_err(|e| JitError::Object {
        message: e.to_string(),
    })?;

    // Lay out allocated sections; unwind tables are left out since nothing registers them.
    let mut offsets: BTreeMap<usize, usize> = BTreeMap::new();
    let mut code = Vec::new();
    let mut cursor = 0usize;
    for (idx, sh) in elf.section_headers.iter().enumerate() {
        let name = elf.shdr_strtab.get_at(sh.sh_name).unwrap_or("");
        if sh.sh_flags & u64::from(SHF_ALLOC) == 0 || sh.sh_size == 0 || name == ".eh_frame" {
            continue;
        }
        if sh.sh_flags & u64::from(SHF_WRITE) != 0 {
            return Err(JitError::UnsupportedSection {
                name: name.to_owned(),
            });
        }
        let off = align_up(cursor, (sh.sh_addralign as usize).max(1));
        offsets.insert(idx, off);
        if sh.sh_flags & u64::from(SHF_EXECINSTR) != 0 {
            code.push((off, sh.sh_size as usize));
        }
        cursor = off + sh.sh_size as usize;
    }

    // One stub and one GOT slot per external symbol, whether or not both get used.
    let mut externals: BTreeMap<usize, (u64, usize)> = BTreeMap::new();
    for (_, relocs) in &elf.shdr_relocs {
        for r in relocs.iter() {
            let Some(sym) = elf.syms.get(r.r_sym) else {
                continue;
            };
            if r.r_sym != 0 && sym.st_shndx == SHN_UNDEF && !externals.contains_key(&r.r_sym) {
                let name = elf.strtab.get_at(sym.st_name).unwrap_or("");
                let addr = external_address(name).ok_or_else(|| JitError::UndefinedSymbol {
                    name: name.to_owned(),
                })?;
                externals.insert(r.r_sym, (addr, 0));
            }
        }
    }
    cursor = align_up(cursor, STUB_SIZE);
    for slot in externals.values_mut() {
        slot.1 = cursor;
        cursor += STUB_SIZE;
    }

    let mut map = MmapMut::map_anon(cursor.max(1)).map_err(|source| JitError::Map { source })?;
    let base = map.as_ptr() as u64;
    for (&idx, &off) in &offsets {
        let sh = &elf.section_headers[idx];
        if sh.sh_type == SHT_NOBITS {
            continue;
        }
        let (start, size) = (sh.sh_offset as usize, sh.sh_size as usize);
        let bytes = obj
            .get(start..start + size)
            .ok_or_else(|| JitError::Object {
                message: format!("section {idx} lies outside the object"),
            })?;
        map[off..off + size].copy_from_slice(bytes);
    }
    for &(addr, off) in externals.values() {
        map[off..off + STUB.len()].copy_from_slice(&STUB);
        map[off + 6..off + 14].copy_from_slice(&addr.to_le_bytes());
    }

    let symbol_address = |index: usize| -> Result<(u64, Option<u64>), JitError> {
        let sym = elf.syms.get(index).ok_or_else(|| JitError::Object {
            message: format!("relocation names missing symbol {index}"),
        })?;
        if let Some(&(addr, stub)) = externals.get(&index) {
            return Ok((addr, Some(base + stub as u64 + 6)));
        }
        match sym.st_shndx {
            SHN_ABS => Ok((sym.st_value, None)),
            shndx => {
                let off = offsets.get(&shndx).ok_or_else(|| JitError::Object {
                    message: format!("symbol {index} lives in unloaded section {shndx}"),
                })?;
                Ok((base + *off as u64 + sym.st_value, None))
            }
        }
    };

    for (reloc_idx, relocs) in &elf.shdr_relocs {
        let target = elf.section_headers[*reloc_idx].sh_info as usize;
        let Some(&toff) = offsets.get(&target) else {
            continue;
        };
        for r in relocs.iter() {
            if r.r_type == R_X86_64_NONE {
                continue;
            }
            let at = toff + r.r_offset as usize;
            let p = base + at as u64;
            let a = r.r_addend.unwrap_or(0);
            let (s, got) = symbol_address(r.r_sym)?;
            let stub = got.map(|g| g - 6);
            let name = || {
                elf.syms
                    .get(r.r_sym)
                    .and_then(|s| elf.strtab.get_at(s.st_name))
                    .unwrap_or("")
                    .to_owned()
            };
            let overflow = || JitError::RelocationOverflow {
                kind: r.r_type,
                symbol: name(),
            };
            let pc32 = |dest: u64| -> Result<[u8; 4], JitError> {
                let v = (dest as i64).wrapping_add(a).wrapping_sub(p as i64);
                i32::try_from(v)
                    .map(i32::to_le_bytes)
                    .map_err(|_| overflow())
            };
            trace!(kind = r.r_type, offset = at, "relocation");
            match r.r_type {
                R_X86_64_64 => {
                    map[at..at + 8].copy_from_slice(&(s as i64).wrapping_add(a).to_le_bytes())
                }
                R_X86_64_PC64 => map[at..at + 8].copy_from_slice(
                    &(s as i64)
                        .wrapping_add(a)
                        .wrapping_sub(p as i64)
                        .to_le_bytes(),
                ),
                R_X86_64_PC32 | R_X86_64_PLT32 => {
                    let v = pc32(stub.unwrap_or(s))?;
                    map[at..at + 4].copy_from_slice(&v);
                }
                R_X86_64_GOTPCREL | R_X86_64_GOTPCRELX | R_X86_64_REX_GOTPCRELX => {
                    // The stub's address word doubles as the GOT slot; local symbols are
                    // not expected here from PIC code without preemption.
                    let v = pc32(got.ok_or_else(|| JitError::UnsupportedRelocation {
                        kind: r.r_type,
                        symbol: name(),
                    })?)?;
                    map[at..at + 4].copy_from_slice(&v);
                }
                R_X86_64_32 => {
                    let v = u32::try_from((s as i64).wrapping_add(a)).map_err(|_| overflow())?;
                    map[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                R_X86_64_32S => {
                    let v = i32::try_from((s as i64).wrapping_add(a)).map_err(|_| overflow())?;
                    map[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                kind => {
                    return Err(JitError::UnsupportedRelocation {
                        kind,
                        symbol: name(),
                    })
                }
            }
        }
    }

    let entry = elf
        .syms
        .iter()
        .find(|s| elf.strtab.get_at(s.st_name) == Some(entry_name) && s.st_shndx != SHN_UNDEF)
        .and_then(|s| {
            offsets
                .get(&s.st_shndx)
                .map(|off| off + s.st_value as usize)
        })
        .ok_or_else(|| JitError::EntryMissing {
            name: entry_name.to_owned(),
        })?;

    let map = map.make_exec().map_err(|source| JitError::Map { source })?;
    Ok(LoadedCode {
        map,
        entry,
        code,
        calls_libc: !externals.is_empty(),
    })
}
