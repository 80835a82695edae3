//! Code objects: what a Python frame is named by, copied once per code object while the
//! code object is alive.
//!
//! Names could be read when the graph is written, but that is at exit, after the
//! interpreter has finalized and freed most code objects; so the first capture that meets a
//! code object copies its name, file, first line and line table, and later captures only
//! check that the code object at that address is still the one copied (its name, file
//! and table pointers and first line), one read per frame. Lines are looked up in the
//! copied table when the graph is written.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::layout::{Frames, LineTable, OWNED_BY_CSTACK, OWNED_BY_GENERATOR};
use super::lines::line_at;
use super::memory::Memory;
use super::walk::RawFrame;
use super::Interpreter;

/// Code objects kept per capturer; past this many, new ones are shown unnamed.
const MAX_CODES: usize = 1 << 16;
/// Characters of a name or file kept; a longer one is shown unnamed.
const MAX_CHARS: usize = 4096;
/// Bytes of a line table kept; a longer one gives no lines.
const MAX_TABLE: usize = 1 << 20;

/// One entry of a stack's Python part, innermost first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PyEntry {
    /// A Python frame: its code object (an index in [`Codes`]) and the code unit it was
    /// at.
    Frame { code: u32, unit: i32 },
    /// The frames since the previous mark were run by one native call of the evaluation
    /// loop (`_PyEval_EvalFrameDefault`).
    CallEnd,
}

/// A code object the capture could not name.
pub(crate) const UNNAMED: u32 = u32::MAX;

/// What names a code object, copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CodeInfo {
    pub name: Box<str>,
    pub file: Box<str>,
    pub first_line: i32,
    pub table: Box<[u8]>,
    pub format: LineTable,
}

impl CodeInfo {
    /// The line shown for `unit`: none where the table has none, or no line a person
    /// could look up (a module's prologue is on line 0).
    pub(crate) fn line(&self, unit: i32) -> Option<u32> {
        line_at(self.format, &self.table, self.first_line, unit)
            .and_then(|l| u32::try_from(l).ok())
            .filter(|&l| l > 0)
    }
}

/// The pointers and first line that tell one code object from another that later took
/// its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Identity {
    name: usize,
    file: usize,
    table: usize,
    first_line: i32,
}

/// The code objects met so far.
#[derive(Default)]
pub(crate) struct Codes {
    by_address: HashMap<usize, (Identity, u32), BuildHasherDefault<AddressHash>>,
    infos: Vec<CodeInfo>,
}

/// A hash of an address, cheaper than the default (which resists chosen keys; the
/// allocator chooses these): a multiply, folded so that the aligned low bits the table
/// indexes by depend on the high ones.
#[derive(Default)]
struct AddressHash(u64);

impl Hasher for AddressHash {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Codes {
    pub(crate) fn get(&self, code: u32) -> Option<&CodeInfo> {
        self.infos.get(code as usize)
    }

    #[cfg(test)]
    pub(crate) fn push_for_tests(&mut self, info: CodeInfo) {
        self.infos.push(info);
    }

    /// Appends the entries for `frames` (a walk's, innermost first) to `out`, copying the
    /// code objects met for the first time. Stops at the first frame whose code object is
    /// not one: what the walk found from there on cannot be trusted.
    pub(crate) fn add(
        &mut self,
        mem: &impl Memory,
        interp: &Interpreter,
        frames: &[RawFrame],
        out: &mut Vec<PyEntry>,
    ) {
        let l = &interp.layout;
        for f in frames {
            if matches!(l.frames, Frames::EntryFrame { .. }) && f.owner == OWNED_BY_CSTACK {
                out.push(PyEntry::CallEnd);
                continue;
            }
            if !f.code.is_multiple_of(8) {
                return;
            }
            let Some(header) = mem.span(f.code, l.code_len) else {
                return;
            };
            if header.word(l.ob_type) != interp.code_type {
                return;
            }
            let identity = Identity {
                name: header.word(l.code_name),
                file: header.word(l.code_filename),
                table: header.word(l.code_linetable),
                first_line: header.int(l.code_firstlineno),
            };
            let unit = match l.code_units {
                // 3.10's f_lasti is already an index of code units.
                None => f.instr as i64 as i32,
                Some(units) => {
                    let from = f.code.wrapping_add(units) as u64;
                    let delta = f.instr.wrapping_sub(from) as i64;
                    // One unit before the first is a frame that has not started.
                    (delta.div_euclid(2)).clamp(-1, i32::MAX as i64) as i32
                }
            };
            // A frame still being set up is left out, as CPython's tracebacks do; it
            // still closes its call of the evaluation loop.
            let incomplete = f.owner != OWNED_BY_GENERATOR
                && l.code_first_traceable.is_some_and(|o| unit < header.int(o));
            if !incomplete {
                let code = self.intern(mem, interp, f.code, identity);
                out.push(PyEntry::Frame { code, unit });
            }
            let ends_call = match l.frames {
                Frames::Objects { .. } => true,
                Frames::EntryFlag { .. } => f.entry,
                Frames::EntryFrame { .. } => false,
            };
            if ends_call {
                out.push(PyEntry::CallEnd);
            }
        }
    }

    fn intern(
        &mut self,
        mem: &impl Memory,
        interp: &Interpreter,
        code: usize,
        id: Identity,
    ) -> u32 {
        if let Some(&(known, n)) = self.by_address.get(&code) {
            if known == id {
                return n;
            }
        }
        if self.infos.len() >= MAX_CODES {
            return UNNAMED;
        }
        let l = &interp.layout;
        let info = CodeInfo {
            name: read_str(mem, interp, id.name)
                .unwrap_or_else(|| "?".into())
                .into(),
            file: read_str(mem, interp, id.file)
                .unwrap_or_else(|| "?".into())
                .into(),
            first_line: id.first_line,
            table: read_bytes(mem, interp, id.table).unwrap_or_default().into(),
            format: l.line_table,
        };
        let n = self.infos.len() as u32;
        self.infos.push(info);
        self.by_address.insert(code, (id, n));
        n
    }
}

/// A `str` object's text (compact strings only, as names and file names are).
fn read_str(mem: &impl Memory, interp: &Interpreter, at: usize) -> Option<String> {
    let l = &interp.layout;
    // The length and state are in the header every string has; a short ASCII name may
    // end before a wider string's header would.
    if !at.is_multiple_of(8) {
        return None;
    }
    let head = mem.span(at, l.str_ascii_data)?;
    let length = head.word(l.str_length) as i64;
    let state = head.int(l.str_state) as u32;
    let (kind, compact, ascii) = ((state >> 2) & 7, state & 0x20 != 0, state & 0x40 != 0);
    let length = usize::try_from(length).ok().filter(|&n| n <= MAX_CHARS)?;
    if !compact || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let data = if ascii {
        l.str_ascii_data
    } else {
        l.str_compact_data
    };
    let width = kind as usize;
    let mut raw = vec![0u8; length * width];
    if !mem.read(at.wrapping_add(data), &mut raw) {
        return None;
    }
    let text = match width {
        1 => raw.iter().map(|&b| char::from(b)).collect(),
        2 => raw
            .chunks_exact(2)
            .map(|c| char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))).unwrap_or('?'))
            .collect(),
        _ => raw
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('?'))
            .collect(),
    };
    Some(text)
}

/// A `bytes` object's contents.
fn read_bytes(mem: &impl Memory, interp: &Interpreter, at: usize) -> Option<Vec<u8>> {
    let l = &interp.layout;
    let size = mem
        .word(at.wrapping_add(l.bytes_size))
        .filter(|_| at.is_multiple_of(8))?;
    if size > MAX_TABLE {
        return None;
    }
    let mut raw = vec![0u8; size];
    mem.read(at.wrapping_add(l.bytes_data), &mut raw)
        .then_some(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::layout::Layout;
    use crate::python::memory::tests::Fake;

    const CODE_TYPE: usize = 0x5000;

    fn interp(minor: u8) -> Interpreter {
        Interpreter::for_tests(Layout::of(minor).unwrap(), CODE_TYPE)
    }

    /// A compact ASCII `str` of 3.12 or 3.13.
    fn ascii_312(text: &str) -> Vec<u8> {
        let mut s = vec![0u8; 40];
        s[16..24].copy_from_slice(&(text.len() as i64).to_le_bytes());
        s[32..36].copy_from_slice(&(0x20u32 | 0x40 | (1 << 2)).to_le_bytes());
        s.extend_from_slice(text.as_bytes());
        s.push(0);
        s
    }

    /// A 3.12 code object at `at`: named `name`, in `file`, from line `first`, whose line
    /// table is `table`.
    fn code_312(at: usize, name: &str, first: i32, table: &[u8]) -> Vec<(usize, Vec<u8>)> {
        let l = Layout::of(12).unwrap();
        let mut code = vec![0u8; 400];
        code[8..16].copy_from_slice(&CODE_TYPE.to_le_bytes());
        let (n, f, t) = (at + 0x1000, at + 0x2000, at + 0x3000);
        code[l.code_name..l.code_name + 8].copy_from_slice(&n.to_le_bytes());
        code[l.code_filename..l.code_filename + 8].copy_from_slice(&f.to_le_bytes());
        code[l.code_linetable..l.code_linetable + 8].copy_from_slice(&t.to_le_bytes());
        code[l.code_firstlineno..l.code_firstlineno + 4].copy_from_slice(&first.to_le_bytes());
        let mut bytes = vec![0u8; 32];
        bytes[16..24].copy_from_slice(&(table.len() as u64).to_le_bytes());
        bytes.extend_from_slice(table);
        vec![
            (at, code),
            (n, ascii_312(name)),
            (f, ascii_312("model.py")),
            (t, bytes),
        ]
    }

    fn frame(code: usize, unit: u64, owner: u8) -> RawFrame {
        RawFrame {
            code,
            instr: code as u64 + 192 + 2 * unit,
            owner,
            entry: false,
        }
    }

    #[test]
    fn frames_are_named_once_per_code_object_and_calls_marked() {
        // Two units on the first line, one on the next (3.11 location entries).
        let table = [0x80 | 1, 0, 0x80 | (11 << 3), 0, 0];
        let mut regions = code_312(0x10000, "Model.forward", 40, &table);
        regions.extend(code_312(0x20000, "main", 7, &table));
        let mem = Fake::new(&regions);
        let interp = interp(12);
        let mut codes = Codes::default();
        let mut out = Vec::new();
        let frames = [
            frame(0x10000, 2, 0),
            frame(0x10000, 0, 0),
            frame(0x99999, 0, OWNED_BY_CSTACK),
            frame(0x20000, 1, 0),
        ];
        codes.add(&mem, &interp, &frames, &mut out);
        assert_eq!(
            out,
            [
                PyEntry::Frame { code: 0, unit: 2 },
                PyEntry::Frame { code: 0, unit: 0 },
                PyEntry::CallEnd,
                PyEntry::Frame { code: 1, unit: 1 },
            ]
        );
        let forward = codes.get(0).unwrap();
        assert_eq!(
            (&*forward.name, &*forward.file),
            ("Model.forward", "model.py")
        );
        assert_eq!([forward.line(0), forward.line(2)], [Some(40), Some(41)]);
        assert_eq!(codes.infos.len(), 2);
    }

    #[test]
    fn a_code_object_replaced_at_the_same_address_is_named_anew() {
        let mut mem = Fake::new(&code_312(0x10000, "first", 1, &[]));
        let interp = interp(12);
        let mut codes = Codes::default();
        let mut out = Vec::new();
        codes.add(&mem, &interp, &[frame(0x10000, 0, 0)], &mut out);
        // The same address now holds a code object with another name.
        let mut other = code_312(0x10000, "second", 1, &[]);
        other[1].0 = 0x10000 + 0x1800;
        let name_at = other[1].0.to_le_bytes();
        other[0].1[128..136].copy_from_slice(&name_at);
        mem = Fake::new(&other);
        codes.add(&mem, &interp, &[frame(0x10000, 0, 0)], &mut out);
        let names: Vec<&str> = codes.infos.iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["first", "second"]);
    }

    #[test]
    fn a_frame_whose_code_is_not_a_code_object_ends_the_stack() {
        let mut regions = code_312(0x10000, "ok", 1, &[]);
        regions.push((0x30000, vec![0xffu8; 400]));
        let mem = Fake::new(&regions);
        let mut codes = Codes::default();
        let mut out = Vec::new();
        let frames = [
            frame(0x10000, 0, 0),
            frame(0x30000, 0, 0),
            frame(0x10000, 0, 0),
        ];
        codes.add(&mem, &interp(12), &frames, &mut out);
        assert_eq!(out, [PyEntry::Frame { code: 0, unit: 0 }]);
        out.clear();
        codes.add(&mem, &interp(12), &[frame(0xdead_0000, 0, 0)], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn strings_of_every_width_and_bad_ones() {
        let l = Layout::of(12).unwrap();
        let interp = interp(12);
        let mut wide = vec![0u8; l.str_compact_data];
        wide[16..24].copy_from_slice(&2i64.to_le_bytes());
        wide[32..36].copy_from_slice(&(0x20u32 | (2 << 2)).to_le_bytes());
        wide.extend_from_slice(&[0x3b1u16.to_le_bytes(), 0x3b2u16.to_le_bytes()].concat());
        let mut huge = ascii_312("x");
        huge[16..24].copy_from_slice(&(1i64 << 40).to_le_bytes());
        let mut legacy = ascii_312("x");
        legacy[32] &= !0x20;
        let mem = Fake::new(&[
            (0x1000, wide),
            (0x2000, huge),
            (0x3000, legacy),
            (0x4000, ascii_312("train.py")),
        ]);
        assert_eq!(read_str(&mem, &interp, 0x1000).as_deref(), Some("αβ"));
        assert_eq!(read_str(&mem, &interp, 0x4000).as_deref(), Some("train.py"));
        for bad in [0x2000, 0x3000, 0x4001, 0x9000] {
            assert_eq!(read_str(&mem, &interp, bad), None, "{bad:#x}");
        }
    }
}
