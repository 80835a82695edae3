//! The differential corpus and the kernel as oracle, shared by the corpus test
//! (`tests/kernel_diff.rs`), the kernel-ratio bench and the corpus generator.
//!
//! A corpus entry is a `.s` file: uBPF assembler text (what `bpftime_isa::asm`
//! reads) plus directives in `#@` comments and a few pseudo-instructions:
//!
//! ```text
//! #@ type kprobe                       program type (only kprobe is loadable in both)
//! #@ map counts hash 4 8 64 [flags]    a map: name, type, key, value, max_entries
//! #@ intent reject                     what the author meant (the kernel decides)
//! ldmap %r1, counts                    lddw of a map (BPF_PSEUDO_MAP_FD)
//! ldmapval %r1, counts, 8              lddw of a map value address (BPF_PSEUDO_MAP_VALUE)
//! ldfunc %r2, 5                        lddw of a subprogram 5 slots after the next one
//! .raw 0x00000000000000b7              one slot, as a little-endian u64
//! ```

#![allow(dead_code)] // each user takes a different part

pub mod elf;
pub mod kernel;
// The one check every oracle test shares (bpftime-tests owns it; this crate
// cannot depend on that one).
#[path = "../../../tests/src/kernel_object.rs"]
pub mod kernel_object;
pub mod mutate;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use bpftime_isa::asm::assemble;
use bpftime_isa::opcode as op;
use bpftime_isa::uapi::{map_type as mt, prog_type};
use bpftime_isa::Insn;
use bpftime_verifier::MapDesc;

/// One map an entry needs: created in the kernel, described to ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSpec {
    pub name: String,
    pub desc: MapDesc,
}

/// What the author of a hand-written entry meant it to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    Accept,
    Reject,
}

#[derive(Clone, Debug)]
pub struct Entry {
    /// Path under `corpus/` without the extension, e.g. `rules/stack_bounds_bad`.
    pub name: String,
    pub prog_type: u32,
    pub maps: Vec<MapSpec>,
    pub intent: Option<Intent>,
    /// Map references hold the map's index in `maps` (both `imm` of an `lddw`
    /// with a map source); the kernel gets real fds in their place.
    pub insns: Vec<Insn>,
}

impl Entry {
    /// Our verifier's view of map `imm`.
    pub fn map(&self, imm: i32) -> Option<MapDesc> {
        usize::try_from(imm)
            .ok()
            .and_then(|i| self.maps.get(i))
            .map(|m| m.desc.clone())
    }
}

pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

const MAP_TYPES: &[(&str, u32)] = &[
    ("hash", mt::HASH),
    ("array", mt::ARRAY),
    ("prog_array", mt::PROG_ARRAY),
    ("perf_event_array", mt::PERF_EVENT_ARRAY),
    ("percpu_hash", mt::PERCPU_HASH),
    ("percpu_array", mt::PERCPU_ARRAY),
    ("stack_trace", mt::STACK_TRACE),
    ("lru_hash", mt::LRU_HASH),
    ("lru_percpu_hash", mt::LRU_PERCPU_HASH),
    ("lpm_trie", mt::LPM_TRIE),
    ("queue", mt::QUEUE),
    ("stack", mt::STACK),
    ("ringbuf", mt::RINGBUF),
    ("bloom_filter", mt::BLOOM_FILTER),
];

const PROG_TYPES: &[(&str, u32)] = &[
    ("kprobe", prog_type::KPROBE),
    ("tracepoint", prog_type::TRACEPOINT),
    ("raw_tracepoint", prog_type::RAW_TRACEPOINT),
];

pub fn map_type_name(t: u32) -> Option<&'static str> {
    MAP_TYPES.iter().find(|(_, v)| *v == t).map(|(n, _)| *n)
}

fn num(s: &str) -> Result<i64, String> {
    let (neg, body) = match s.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, s),
    };
    // Hex is a bit pattern (up to 64 bits); decimal a signed number.
    let v = match body.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map(|v| v as i64),
        None => body.parse::<i64>(),
    }
    .map_err(|_| format!("`{s}` is not a number"))?;
    Ok(if neg { v.wrapping_neg() } else { v })
}

/// A fixup the text leaves for after assembly: slot index and what goes there.
enum Fixup {
    Map { slot: usize, src: u8, map: i32 },
    Func { slot: usize, rel: i32 },
    Raw { slot: usize, insn: Insn },
}

/// Parses one entry's text (`name` is for errors and the entry's name).
pub fn parse(name: &str, text: &str) -> Result<Entry, String> {
    let err = |line: usize, what: String| format!("{name}:{line}: {what}");
    let mut prog_type = None;
    let mut maps: Vec<MapSpec> = Vec::new();
    let mut intent = None;
    let mut asm = String::new();
    let mut fixups = Vec::new();
    let mut slot = 0usize;
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let trimmed = raw.trim();
        if let Some(d) = trimmed.strip_prefix("#@") {
            let words: Vec<&str> = d.split_whitespace().collect();
            match words.as_slice() {
                ["type", t] => {
                    let v = PROG_TYPES
                        .iter()
                        .find(|(n, _)| n == t)
                        .ok_or_else(|| err(line, format!("unknown program type `{t}`")))?;
                    prog_type = Some(v.1);
                }
                ["map", mname, t, k, v, e, rest @ ..] if rest.len() <= 1 => {
                    let map_type = MAP_TYPES
                        .iter()
                        .find(|(n, _)| n == t)
                        .ok_or_else(|| err(line, format!("unknown map type `{t}`")))?
                        .1;
                    let p = |s: &str| num(s).map(|v| v as u32).map_err(|e| err(line, e));
                    maps.push(MapSpec {
                        name: mname.to_string(),
                        desc: MapDesc {
                            map_type,
                            key_size: p(k)?,
                            value_size: p(v)?,
                            max_entries: p(e)?,
                            flags: rest.first().map(|f| p(f)).transpose()?.unwrap_or(0),
                            ..MapDesc::default()
                        },
                    });
                }
                ["intent", "accept"] => intent = Some(Intent::Accept),
                ["intent", "reject"] => intent = Some(Intent::Reject),
                ["source", ..] => {}
                _ => return Err(err(line, format!("unknown directive `{trimmed}`"))),
            }
            asm.push('\n');
            continue;
        }
        let code = trimmed.split('#').next().unwrap_or("").trim();
        if code.is_empty() || code.ends_with(':') {
            asm.push_str(raw);
            asm.push('\n');
            continue;
        }
        let (m, rest) = code.split_once(char::is_whitespace).unwrap_or((code, ""));
        let ops: Vec<&str> = rest.split(',').map(str::trim).collect();
        let map_index = |s: &str| -> Result<i32, String> {
            maps.iter()
                .position(|m| m.name == s)
                .map(|i| i as i32)
                .ok_or_else(|| err(line, format!("no map named `{s}`")))
        };
        match m {
            "ldmap" | "ldmapval" => {
                let want = if m == "ldmap" { 2 } else { 3 };
                if ops.len() != want {
                    return Err(err(line, format!("`{m}` takes {want} operands")));
                }
                let map = map_index(ops[1])?;
                let (src, hi) = if m == "ldmap" {
                    (op::PSEUDO_MAP_FD, 0)
                } else {
                    (op::PSEUDO_MAP_VALUE, num(ops[2]).map_err(|e| err(line, e))?)
                };
                fixups.push(Fixup::Map { slot, src, map });
                let _ = writeln!(asm, "lddw {}, {}", ops[0], hi << 32);
                slot += 2;
            }
            "ldfunc" => {
                if ops.len() != 2 {
                    return Err(err(line, "`ldfunc` takes 2 operands".into()));
                }
                let rel = num(ops[1]).map_err(|e| err(line, e))? as i32;
                fixups.push(Fixup::Func { slot, rel });
                let _ = writeln!(asm, "lddw {}, 0", ops[0]);
                slot += 2;
            }
            ".raw" => {
                let v = num(rest.trim()).map_err(|e| err(line, e))? as u64;
                fixups.push(Fixup::Raw {
                    slot,
                    insn: Insn::from_bytes(v.to_le_bytes()),
                });
                asm.push_str("ja +0\n");
                slot += 1;
            }
            _ => {
                asm.push_str(raw);
                asm.push('\n');
                slot += if m == "lddw" { 2 } else { 1 };
            }
        }
    }
    let mut insns = assemble(&asm).map_err(|e| format!("{name}: {e}"))?;
    for f in fixups {
        match f {
            Fixup::Map { slot, src, map } => {
                insns[slot].src = src;
                insns[slot].imm = map;
            }
            Fixup::Func { slot, rel } => {
                insns[slot].src = op::PSEUDO_FUNC;
                insns[slot].imm = rel;
            }
            Fixup::Raw { slot, insn } => insns[slot] = insn,
        }
    }
    Ok(Entry {
        name: name.to_string(),
        prog_type: prog_type.ok_or_else(|| format!("{name}: no `#@ type` line"))?,
        maps,
        intent,
        insns,
    })
}

/// Every entry under `corpus/`, sorted by name.
pub fn load_all() -> Vec<Entry> {
    let root = corpus_dir();
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "s") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
        .iter()
        .map(|p| {
            let name = p
                .strip_prefix(&root)
                .unwrap()
                .with_extension("")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(p).unwrap();
            parse(&name, &text).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

// ---- printing --------------------------------------------------------------

fn size_name(code: u8) -> &'static str {
    match code & op::SIZE_MASK {
        op::B => "b",
        op::H => "h",
        op::W => "w",
        _ => "dw",
    }
}

fn mem(reg: u8, off: i16) -> String {
    match off {
        0 => format!("[%r{reg}]"),
        o if o < 0 => format!("[%r{reg}-{}]", -(o as i32)),
        o => format!("[%r{reg}+{o}]"),
    }
}

fn rel(off: i64) -> String {
    if off < 0 {
        format!("{off}")
    } else {
        format!("+{off}")
    }
}

/// uBPF text for one instruction, when the syntax has a form for it.
fn text(i: &Insn) -> Option<String> {
    let src_x = i.code & op::SRC_MASK == op::X;
    let operand = |i: &Insn| {
        if src_x {
            format!("%r{}", i.src)
        } else {
            format!("{}", i.imm)
        }
    };
    Some(match i.class() {
        op::ALU | op::ALU64 => {
            let w = if i.class() == op::ALU { "32" } else { "" };
            let o = i.code & op::OP_MASK;
            let name = match (o, i.off) {
                (op::END, _) => {
                    let p = match (i.class(), src_x) {
                        (op::ALU, true) => "be",
                        (op::ALU, false) => "le",
                        _ => "bswap",
                    };
                    return Some(format!("{p}{} %r{}", i.imm, i.dst));
                }
                (op::NEG, _) => return Some(format!("neg{w} %r{}", i.dst)),
                (op::MOV, 8 | 16 | 32) if src_x => {
                    let to = if i.class() == op::ALU { "32" } else { "64" };
                    return Some(format!("movsx{}{to} %r{}, %r{}", i.off, i.dst, i.src));
                }
                (op::DIV, 1) => "sdiv",
                (op::MOD, 1) => "smod",
                (op::ADD, _) => "add",
                (op::SUB, _) => "sub",
                (op::MUL, _) => "mul",
                (op::DIV, _) => "div",
                (op::OR, _) => "or",
                (op::AND, _) => "and",
                (op::LSH, _) => "lsh",
                (op::RSH, _) => "rsh",
                (op::MOD, _) => "mod",
                (op::XOR, _) => "xor",
                (op::MOV, _) => "mov",
                (op::ARSH, _) => "arsh",
                _ => return None,
            };
            format!("{name}{w} %r{}, {}", i.dst, operand(i))
        }
        op::LDX => {
            let s = if i.code & op::MODE_MASK == op::MEMSX {
                "s"
            } else {
                ""
            };
            format!(
                "ldx{s}{} %r{}, {}",
                size_name(i.code),
                i.dst,
                mem(i.src, i.off)
            )
        }
        op::ST => format!("st{} {}, {}", size_name(i.code), mem(i.dst, i.off), i.imm),
        op::STX if i.code & op::MODE_MASK == op::ATOMIC => {
            let base = i.imm & !op::FETCH;
            let (name, fetch) = match i.imm {
                op::ATOMIC_XCHG => ("xchg", ""),
                op::ATOMIC_CMPXCHG => ("cmpxchg", ""),
                _ => {
                    let n = match base {
                        op::ATOMIC_ADD => "add",
                        op::ATOMIC_OR => "or",
                        op::ATOMIC_AND => "and",
                        op::ATOMIC_XOR => "xor",
                        _ => return None,
                    };
                    (n, if i.imm & op::FETCH != 0 { "fetch " } else { "" })
                }
            };
            let w = if i.code & op::SIZE_MASK == op::W {
                "32"
            } else {
                ""
            };
            format!("lock {fetch}{name}{w} {}, %r{}", mem(i.dst, i.off), i.src)
        }
        op::STX => format!(
            "stx{} {}, %r{}",
            size_name(i.code),
            mem(i.dst, i.off),
            i.src
        ),
        op::JMP | op::JMP32 => {
            let w = if i.class() == op::JMP32 { "32" } else { "" };
            let o = i.code & op::OP_MASK;
            let name = match o {
                op::EXIT => return Some("exit".into()),
                op::CALL if src_x => return Some(format!("callx %r{}", i.dst)),
                op::CALL if i.src == op::CALL_PSEUDO => {
                    return Some(format!("call local {}", rel(i.imm as i64)))
                }
                op::CALL => return Some(format!("call {}", i.imm)),
                op::JA if i.class() == op::JMP32 => {
                    return Some(format!("gotol {}", rel(i.imm as i64)))
                }
                op::JA => return Some(format!("ja {}", rel(i.off as i64))),
                op::JEQ => "jeq",
                op::JGT => "jgt",
                op::JGE => "jge",
                op::JSET => "jset",
                op::JNE => "jne",
                op::JSGT => "jsgt",
                op::JSGE => "jsge",
                op::JLT => "jlt",
                op::JLE => "jle",
                op::JSLT => "jslt",
                op::JSLE => "jsle",
                _ => return None,
            };
            format!(
                "{name}{w} %r{}, {}, {}",
                i.dst,
                operand(i),
                rel(i.off as i64)
            )
        }
        _ => return None,
    })
}

fn raw(s: &mut String, i: &Insn) {
    let _ = writeln!(s, ".raw {:#018x}", u64::from_le_bytes(i.to_bytes()));
}

/// The text of an entry; `parse(print(e))` gives `e` back.
pub fn print(e: &Entry, header: &[String]) -> String {
    let mut s = String::new();
    for h in header {
        let _ = writeln!(s, "# {h}");
    }
    let t = PROG_TYPES
        .iter()
        .find(|(_, v)| *v == e.prog_type)
        .expect("a corpus program type")
        .0;
    let _ = writeln!(s, "#@ type {t}");
    for m in &e.maps {
        let d = &m.desc;
        let _ = write!(
            s,
            "#@ map {} {} {} {} {}",
            m.name,
            map_type_name(d.map_type).expect("a corpus map type"),
            d.key_size,
            d.value_size,
            d.max_entries
        );
        if d.flags != 0 {
            let _ = write!(s, " {:#x}", d.flags);
        }
        s.push('\n');
    }
    match e.intent {
        Some(Intent::Accept) => s.push_str("#@ intent accept\n"),
        Some(Intent::Reject) => s.push_str("#@ intent reject\n"),
        None => {}
    }
    let mut pc = 0;
    while pc < e.insns.len() {
        let i = &e.insns[pc];
        if i.is_lddw() && pc + 1 < e.insns.len() {
            let hi = e.insns[pc + 1];
            let clean_hi = hi.code == 0 && hi.dst == 0 && hi.src == 0 && hi.off == 0;
            let map = usize::try_from(i.imm).ok().and_then(|k| e.maps.get(k));
            let line = match (i.src, map) {
                _ if !clean_hi || i.off != 0 || i.dst > 10 => None,
                (0, _) => Some(format!(
                    "lddw %r{}, {:#x}",
                    i.dst,
                    ((hi.imm as u32 as u64) << 32) | i.imm as u32 as u64
                )),
                (op::PSEUDO_MAP_FD, Some(m)) if hi.imm == 0 => {
                    Some(format!("ldmap %r{}, {}", i.dst, m.name))
                }
                (op::PSEUDO_MAP_VALUE, Some(m)) => {
                    Some(format!("ldmapval %r{}, {}, {}", i.dst, m.name, hi.imm))
                }
                (op::PSEUDO_FUNC, _) if hi.imm == 0 => {
                    Some(format!("ldfunc %r{}, {}", i.dst, i.imm))
                }
                _ => None,
            };
            match line {
                Some(l) => {
                    s.push_str(&l);
                    s.push('\n');
                }
                None => {
                    raw(&mut s, i);
                    raw(&mut s, &hi);
                }
            }
            pc += 2;
            continue;
        }
        // Only text that assembles back to the same slot; anything else is raw.
        match text(i).filter(|t| assemble(t).ok().as_deref() == Some(std::slice::from_ref(i))) {
            Some(t) => {
                s.push_str(&t);
                s.push('\n');
            }
            None => raw(&mut s, i),
        }
        pc += 1;
    }
    s
}
