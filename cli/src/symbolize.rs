//! Names for user-space addresses of the app `bpftime run` started: which
//! file each address falls in, from the app's `/proc/<pid>/maps`, and which
//! function of that file, from its ELF symbol tables. The app's mappings are
//! gone once it exits, so they are captured while it runs ([`AppMaps::refresh`]
//! on every turn of the event loop) and kept: a library the app unmapped is
//! still named for the stacks taken while it was there.

use bpftime_attach::{parse_proc_maps, ProcMapping};
use goblin::elf::program_header::PT_LOAD;
use goblin::elf::{section_header, sym, Elf};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The executable, file-backed mappings of a `/proc/<pid>/maps` text.
fn parse_maps(text: &str) -> Vec<ProcMapping> {
    parse_proc_maps(text)
        .into_iter()
        .filter(|m| m.exec && m.file_path().is_some() && !m.path.ends_with(" (deleted)"))
        .collect()
}

/// The function symbols of one ELF file, by virtual address, and how file
/// offsets map to virtual addresses.
struct Symbols {
    /// (address, size, name), sorted by address; sizes of 0 are kept as 1.
    funcs: Vec<(u64, u64, String)>,
    /// (file offset, virtual address, file size) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl Symbols {
    fn read(path: &Path) -> Option<Symbols> {
        let bytes = std::fs::read(path).ok()?;
        let elf = Elf::parse(&bytes).ok()?;
        let segments = elf
            .program_headers
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .map(|p| (p.p_offset, p.p_vaddr, p.p_filesz))
            .collect();
        let mut funcs: Vec<(u64, u64, String)> =
            [(&elf.syms, &elf.strtab), (&elf.dynsyms, &elf.dynstrtab)]
                .into_iter()
                .flat_map(|(syms, strs)| {
                    syms.iter().filter_map(move |s| {
                        let func = matches!(s.st_type(), sym::STT_FUNC | sym::STT_GNU_IFUNC);
                        let defined = s.st_shndx != section_header::SHN_UNDEF as usize;
                        if !func || !defined || s.st_value == 0 {
                            return None;
                        }
                        let name = strs.get_at(s.st_name)?;
                        Some((s.st_value, s.st_size.max(1), name.to_string()))
                    })
                })
                .collect();
        // The static and the dynamic table often name one function twice.
        funcs.sort();
        funcs.dedup_by(|a, b| a.0 == b.0 && a.2 == b.2);
        Some(Symbols { funcs, segments })
    }

    fn vaddr_of(&self, file_offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(off, _, size)| file_offset >= off && file_offset < off + size)
            .map(|&(off, vaddr, _)| file_offset - off + vaddr)
    }

    /// The function holding `vaddr`, and how far into it `vaddr` is.
    fn function_at(&self, vaddr: u64) -> Option<(&str, u64)> {
        let after = self.funcs.partition_point(|f| f.0 <= vaddr);
        // Among the functions starting at or below `vaddr`, the nearest one
        // that covers it (an alias or a wider enclosing symbol may come first).
        self.funcs[..after]
            .iter()
            .rev()
            .take(8)
            .find(|f| vaddr < f.0 + f.1)
            .map(|f| (f.2.as_str(), vaddr - f.0))
    }
}

/// The mappings of one app, accumulated over its run, and the symbols of
/// every file seen in them.
pub struct AppMaps {
    pid: u32,
    regions: Vec<ProcMapping>,
    last_text: String,
    files: HashMap<PathBuf, Option<Symbols>>,
}

impl AppMaps {
    /// Starts following `pid` (the app, right after exec) and reads its maps once.
    pub fn new(pid: u32) -> AppMaps {
        let mut maps = AppMaps {
            pid,
            regions: Vec::new(),
            last_text: String::new(),
            files: HashMap::new(),
        };
        maps.refresh();
        maps
    }

    /// Reads the app's maps again (nothing once it has exited): new mappings
    /// are added, one that now covers an older one's addresses replaces it.
    pub fn refresh(&mut self) {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)) else {
            return;
        };
        if text == self.last_text {
            return;
        }
        for r in parse_maps(&text) {
            if self.regions.contains(&r) {
                continue;
            }
            self.regions
                .retain(|old| old.end <= r.start || old.start >= r.end);
            self.regions.push(r);
        }
        self.last_text = text;
    }

    /// `function+offset (file)`, `0xADDR (file+0xOFFSET)` where the file has
    /// no symbol there, or `0xADDR (unknown)` outside every file mapping.
    pub fn describe(&mut self, addr: u64) -> String {
        let Some(r) = self
            .regions
            .iter()
            .find(|r| addr >= r.start as u64 && addr < r.end as u64)
        else {
            return format!("{addr:#x} (unknown)");
        };
        let file_offset = addr - r.start as u64 + r.offset;
        let path = PathBuf::from(&r.path);
        let symbols = self
            .files
            .entry(path.clone())
            .or_insert_with(|| Symbols::read(&path));
        let found = symbols.as_ref().and_then(|s| {
            let vaddr = s.vaddr_of(file_offset)?;
            s.function_at(vaddr)
        });
        match found {
            Some((name, off)) => format!("{name}+{off} ({})", path.display()),
            None => format!("{addr:#x} ({}+{file_offset:#x})", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_of_this_test() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn maps_lines_keep_executable_files_only() {
        let text = "\
00400000-00401000 r--p 00000000 fd:01 12 /usr/bin/app
00401000-00402000 r-xp 00001000 fd:01 12 /usr/bin/app
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 
7f0000002000-7f0000003000 r-xp 00002000 fd:01 13 /tmp/a b.so
7f0000004000-7f0000005000 r-xp 00000000 fd:01 14 /tmp/gone.so (deleted)
7ffff0000000-7ffff0001000 r-xp 00000000 00:00 0 [vdso]
";
        let got = parse_maps(text);
        assert_eq!(
            got.iter()
                .map(|r| (r.start, r.offset, r.path.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (0x401000, 0x1000, "/usr/bin/app"),
                (0x7f0000002000, 0x2000, "/tmp/a b.so"),
            ]
        );
    }

    #[test]
    fn this_process_names_its_own_functions() {
        let mut maps = AppMaps::new(std::process::id());
        let f = a_function_of_this_test as fn() -> u64 as usize as u64;
        let exe = std::env::current_exe().unwrap();
        let got = maps.describe(f + 1);
        assert!(
            got.contains("a_function_of_this_test")
                && got.ends_with(&format!("+1 ({})", exe.display())),
            "{got}"
        );
        let heap = Box::new(0u64);
        let addr = &*heap as *const u64 as u64;
        assert_eq!(maps.describe(addr), format!("{addr:#x} (unknown)"));
    }
}
