//! What libbpf does to a clang-built object before `BPF_PROG_LOAD`, in small:
//! map definitions from BTF (`.maps`) or the legacy `maps` section, global data
//! sections as single-element arrays, and each program section linked with the
//! `.text` functions it reaches, relocations applied. Map references are left
//! as indices into the program's map list, as corpus entries hold them.

use std::collections::HashMap;

use bpftime_isa::opcode as op;
use bpftime_isa::uapi::map_type as mt;
use bpftime_isa::{decode, Insn};
use bpftime_verifier::MapDesc;
use goblin::elf::section_header::{SHF_EXECINSTR, SHT_NOBITS};
use goblin::elf::sym::STT_FUNC;
use goblin::elf::Elf;

use super::MapSpec;

pub struct Program {
    /// The section, e.g. `uprobe/work`.
    pub section: String,
    /// The function symbol at the section's start, if any.
    pub name: String,
    pub insns: Vec<Insn>,
    pub maps: Vec<MapSpec>,
}

// ---- BTF, just enough for map definitions ---------------------------------

struct BtfType {
    kind: u32,
    name: String,
    /// `size` or `type`, by kind.
    size_or_type: u32,
    /// Members (name, type) of structs and unions; (type, offset) of a DATASEC.
    members: Vec<(String, u32)>,
    /// (element type, count) of an array.
    array: Option<(u32, u32)>,
}

struct Btf {
    types: Vec<BtfType>,
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| "BTF is truncated".to_string())
}

impl Btf {
    fn parse(b: &[u8]) -> Result<Btf, String> {
        if b.len() < 24 || b[0..2] != 0xeb9fu16.to_le_bytes() {
            return Err("not BTF".into());
        }
        let hdr = u32_at(b, 4)? as usize;
        let type_off = hdr + u32_at(b, 8)? as usize;
        let type_len = u32_at(b, 12)? as usize;
        let str_off = hdr + u32_at(b, 16)? as usize;
        let name = |off: u32| -> String {
            let start = str_off + off as usize;
            let end = b[start..].iter().position(|&c| c == 0).unwrap_or(0);
            String::from_utf8_lossy(&b[start..start + end]).into_owned()
        };
        // Type 0 is void.
        let mut types = vec![BtfType {
            kind: 0,
            name: String::new(),
            size_or_type: 0,
            members: Vec::new(),
            array: None,
        }];
        let mut at = type_off;
        while at < type_off + type_len {
            let name_off = u32_at(b, at)?;
            let info = u32_at(b, at + 4)?;
            let size_or_type = u32_at(b, at + 8)?;
            at += 12;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let mut t = BtfType {
                kind,
                name: name(name_off),
                size_or_type,
                members: Vec::new(),
                array: None,
            };
            match kind {
                1 | 14 | 17 => at += 4, // int, var, decl_tag
                3 => {
                    t.array = Some((u32_at(b, at)?, u32_at(b, at + 8)?));
                    at += 12;
                }
                4 | 5 => {
                    for _ in 0..vlen {
                        t.members.push((name(u32_at(b, at)?), u32_at(b, at + 4)?));
                        at += 12;
                    }
                }
                6 => at += 8 * vlen,  // enum
                13 => at += 8 * vlen, // func_proto
                15 => {
                    for _ in 0..vlen {
                        t.members.push((String::new(), u32_at(b, at)?));
                        at += 12;
                    }
                }
                19 => at += 12 * vlen, // enum64
                2 | 7..=12 | 16 | 18 => {}
                k => return Err(format!("unknown BTF kind {k}")),
            }
            types.push(t);
        }
        Ok(Btf { types })
    }

    fn get(&self, id: u32) -> Result<&BtfType, String> {
        self.types
            .get(id as usize)
            .ok_or_else(|| format!("BTF type {id} missing"))
    }

    /// Follows typedefs and qualifiers.
    fn resolve(&self, mut id: u32) -> Result<&BtfType, String> {
        loop {
            let t = self.get(id)?;
            match t.kind {
                8..=11 | 18 => id = t.size_or_type,
                _ => return Ok(t),
            }
        }
    }

    fn size(&self, id: u32) -> Result<u32, String> {
        let t = self.resolve(id)?;
        Ok(match t.kind {
            2 => 8,
            3 => {
                let (elem, n) = t.array.unwrap();
                self.size(elem)? * n
            }
            _ => t.size_or_type,
        })
    }

    /// Map definitions of the `.maps` section, by variable name.
    fn maps(&self) -> Result<HashMap<String, MapDesc>, String> {
        let mut out = HashMap::new();
        let Some(sec) = self
            .types
            .iter()
            .find(|t| t.kind == 15 && t.name == ".maps")
        else {
            return Ok(out);
        };
        for (_, var) in &sec.members {
            let v = self.get(*var)?;
            let def = self.resolve(v.size_or_type)?;
            let mut d = MapDesc {
                map_type: 0,
                key_size: 0,
                value_size: 0,
                max_entries: 0,
                flags: 0,
                ..MapDesc::default()
            };
            for (field, ty) in &def.members {
                let ptr = self.resolve(*ty)?;
                if ptr.kind != 2 {
                    continue;
                }
                let target = self.resolve(ptr.size_or_type)?;
                let number = || target.array.map(|(_, n)| n).unwrap_or(0);
                match field.as_str() {
                    "type" => d.map_type = number(),
                    "max_entries" => d.max_entries = number(),
                    "map_flags" => d.flags = number(),
                    "key_size" => d.key_size = number(),
                    "value_size" => d.value_size = number(),
                    "key" => d.key_size = self.size(ptr.size_or_type)?,
                    "value" => d.value_size = self.size(ptr.size_or_type)?,
                    _ => {}
                }
            }
            out.insert(v.name.clone(), d);
        }
        Ok(out)
    }
}

// ---- linking ---------------------------------------------------------------

enum MapRef {
    /// A map definition (lddw of the map).
    Def(String),
    /// A global data section (lddw of an address inside it).
    Data(String),
}

/// Every program of a clang-built object, linked and relocated.
pub fn extract(bytes: &[u8]) -> Result<Vec<Program>, String> {
    let elf = Elf::parse(bytes).map_err(|e| e.to_string())?;
    let shname = |i: usize| {
        elf.shdr_strtab
            .get_at(elf.section_headers[i].sh_name)
            .unwrap_or("")
            .to_string()
    };
    let data = |i: usize| -> &[u8] {
        let sh = &elf.section_headers[i];
        if sh.sh_type == SHT_NOBITS {
            return &[];
        }
        &bytes[sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize]
    };
    let find = |n: &str| (0..elf.section_headers.len()).find(|&i| shname(i) == n);
    let text = find(".text");
    let legacy_maps = find("maps");
    let btf_maps_sec = find(".maps");
    let btf_defs = match find(".BTF") {
        Some(i) => Btf::parse(data(i))?.maps()?,
        None => HashMap::new(),
    };

    // What each symbol a relocation may name refers to.
    let mut defs: HashMap<String, MapDesc> = HashMap::new();
    let mut sym_ref: HashMap<usize, MapRef> = HashMap::new();
    for (si, sym) in elf.syms.iter().enumerate() {
        let name = elf.strtab.get_at(sym.st_name).unwrap_or("").to_string();
        let sec = sym.st_shndx;
        if Some(sec) == legacy_maps && sym.st_size == 20 {
            let d = &data(sec)[sym.st_value as usize..][..20];
            let w = |k: usize| u32::from_le_bytes(d[k * 4..k * 4 + 4].try_into().unwrap());
            defs.insert(
                name.clone(),
                MapDesc {
                    map_type: w(0),
                    key_size: w(1),
                    value_size: w(2),
                    max_entries: w(3),
                    flags: w(4),
                    ..MapDesc::default()
                },
            );
            sym_ref.insert(si, MapRef::Def(name));
        } else if Some(sec) == btf_maps_sec {
            let d = btf_defs
                .get(&name)
                .ok_or_else(|| format!("map `{name}` has no BTF definition"))?;
            defs.insert(name.clone(), d.clone());
            sym_ref.insert(si, MapRef::Def(name));
        } else if sec < elf.section_headers.len() {
            let sn = shname(sec);
            if is_data(&sn) {
                sym_ref.insert(si, MapRef::Data(sn));
            }
        }
    }

    // libbpf sizes a perf buffer array without max_entries to the number of
    // CPUs; a fixed count keeps the corpus machine-independent.
    for d in defs.values_mut() {
        if d.map_type == mt::PERF_EVENT_ARRAY && d.max_entries == 0 {
            d.max_entries = 64;
        }
    }
    let relocs = |sec: usize| -> Vec<goblin::elf::Reloc> {
        elf.shdr_relocs
            .iter()
            .filter(|(ri, _)| elf.section_headers[*ri].sh_info as usize == sec)
            .flat_map(|(_, rs)| rs.iter())
            .collect()
    };
    let text_insns = match text {
        Some(t) if !data(t).is_empty() => decode(data(t)).map_err(|e| e.to_string())?,
        _ => Vec::new(),
    };
    let text_relocs = text.map(relocs).unwrap_or_default();
    // .text functions: (first slot, slot count).
    let mut funcs: Vec<(usize, usize)> = elf
        .syms
        .iter()
        .filter(|s| Some(s.st_shndx) == text && s.st_type() == STT_FUNC)
        .map(|s| (s.st_value as usize / 8, s.st_size as usize / 8))
        .collect();
    funcs.sort_unstable();
    funcs.dedup();

    let mut progs = Vec::new();
    for (i, sh) in elf.section_headers.iter().enumerate() {
        let exec = sh.sh_flags & u64::from(SHF_EXECINSTR) != 0;
        if !exec || Some(i) == text || sh.sh_size == 0 {
            continue;
        }
        let name = elf
            .syms
            .iter()
            .find(|s| s.st_shndx == i && s.st_value == 0 && s.st_type() == STT_FUNC)
            .and_then(|s| elf.strtab.get_at(s.st_name))
            .unwrap_or("")
            .to_string();
        let mut insns = decode(data(i)).map_err(|e| e.to_string())?;
        let mut maps: Vec<MapSpec> = Vec::new();
        let mut map_index = |key: &str, desc: MapDesc| -> i32 {
            match maps.iter().position(|m| m.name == key) {
                Some(k) => k as i32,
                None => {
                    maps.push(MapSpec {
                        name: key.to_string(),
                        desc,
                    });
                    maps.len() as i32 - 1
                }
            }
        };
        // Chunks to relocate: (relocations, where the chunk's slot 0 landed,
        // the chunk's first slot in its section, slot count, from .text).
        let mut placed: HashMap<usize, usize> = HashMap::new();
        let mut work: Vec<(Vec<goblin::elf::Reloc>, usize, usize, usize, bool)> =
            vec![(relocs(i), 0, 0, insns.len(), false)];
        while let Some((rs, base, first, count, in_text)) = work.pop() {
            // (slot in the linked program, target slot in .text, is a call)
            let mut links: Vec<(usize, usize, bool)> = Vec::new();
            let mut relocated = Vec::new();
            for r in rs {
                let slot = r.r_offset as usize / 8;
                if slot < first || slot >= first + count {
                    continue;
                }
                let pc = base + slot - first;
                relocated.push(pc);
                let sym = elf.syms.get(r.r_sym).ok_or("bad relocation symbol")?;
                let sym_name = elf.strtab.get_at(sym.st_name).unwrap_or("");
                match sym_ref.get(&r.r_sym) {
                    Some(MapRef::Def(n)) => {
                        insns[pc].src = op::PSEUDO_MAP_FD;
                        insns[pc].imm = map_index(n, defs[n].clone());
                        continue;
                    }
                    Some(MapRef::Data(sec)) => {
                        let size = elf.section_headers[sym.st_shndx].sh_size as u32;
                        let desc = MapDesc {
                            map_type: mt::ARRAY,
                            key_size: 4,
                            value_size: size.max(1),
                            max_entries: 1,
                            flags: 0,
                            ..MapDesc::default()
                        };
                        let off = sym.st_value as i64 + insns[pc].imm as i64;
                        insns[pc].src = op::PSEUDO_MAP_VALUE;
                        insns[pc].imm = map_index(&data_map_name(sec), desc);
                        insns[pc + 1].imm = off as i32;
                        continue;
                    }
                    None => {}
                }
                if Some(sym.st_shndx) != text {
                    return Err(format!("unhandled relocation against `{sym_name}`"));
                }
                // As libbpf reads them: a call's target is the symbol plus `imm + 1`
                // slots (clang puts -1 there for a function symbol); a function
                // address is the symbol plus `imm` bytes.
                let is_call = insns[pc].code == op::CALL_INSN;
                let target = if is_call {
                    (sym.st_value as i64 / 8 + insns[pc].imm as i64 + 1) as usize
                } else {
                    (sym.st_value as i64 + insns[pc].imm as i64) as usize / 8
                };
                links.push((pc, target, is_call));
            }
            // Calls inside .text that clang resolved itself stay relative to .text.
            if in_text {
                for (k, c) in insns[base..base + count].iter().enumerate() {
                    let pc = base + k;
                    if c.code == op::CALL_INSN
                        && c.src == op::CALL_PSEUDO
                        && !relocated.contains(&pc)
                    {
                        let target = (first + k) as i64 + c.imm as i64 + 1;
                        links.push((pc, target as usize, true));
                    }
                }
            }
            for (pc, target, is_call) in links {
                let (fstart, flen) = *funcs
                    .iter()
                    .find(|(s, n)| (*s..*s + *n).contains(&target))
                    .ok_or_else(|| format!("no .text function at slot {target}"))?;
                let at = match placed.get(&fstart) {
                    Some(&at) => at,
                    None => {
                        let at = insns.len();
                        insns.extend_from_slice(&text_insns[fstart..fstart + flen]);
                        placed.insert(fstart, at);
                        work.push((text_relocs.clone(), at, fstart, flen, true));
                        at
                    }
                };
                let dest = at + (target - fstart);
                if !is_call {
                    insns[pc].src = op::PSEUDO_FUNC;
                }
                insns[pc].imm = (dest as i64 - pc as i64 - 1) as i32;
            }
        }
        progs.push(Program {
            section: shname(i),
            name,
            insns,
            maps,
        });
    }
    Ok(progs)
}

fn is_data(section: &str) -> bool {
    [".rodata", ".data", ".bss"]
        .iter()
        .any(|p| section == *p || section.starts_with(&format!("{p}.")))
}

/// A map name for a global data section, usable in corpus text.
fn data_map_name(section: &str) -> String {
    section.trim_start_matches('.').replace('.', "_")
}
