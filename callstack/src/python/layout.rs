//! Where a CPython interpreter keeps what a frame walk reads, per minor version.
//!
//! 3.10 to 3.12 publish nothing about their layout at run time, so their numbers are facts
//! of each version's headers (the default build on x86-64: no `Py_TRACE_REFS`, not free
//! threaded), printed by `callstack/tools/python_layout.c` compiled against them. 3.13
//! publishes its own offsets at the start of `_PyRuntime` (`_Py_DebugOffsets`, for
//! debuggers and profilers); they are read from there, so a build whose layout differs
//! from the default one is still read right.

use super::memory::Memory;

/// How the frames of one version are linked, and how one native call of the evaluation
/// loop shows among them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frames {
    /// 3.10: `PyFrameObject`s linked by `f_back`; every frame is a call of its own of the
    /// evaluation loop; `f_lasti` (an `int`) is the index of the last instruction run.
    Objects { lasti: usize },
    /// 3.11: `_PyInterpreterFrame`s linked by `previous`; the frame a call of the
    /// evaluation loop began with has `is_entry` set (a `bool`).
    EntryFlag { is_entry: usize, owner: usize },
    /// 3.12 and 3.13: each call of the evaluation loop links a frame of its own, owned by
    /// the C stack, below the first Python frame it runs.
    EntryFrame { owner: usize },
}

/// `_PyInterpreterFrame.owner` values (3.11 and later).
pub(crate) const OWNED_BY_GENERATOR: u8 = 1;
pub(crate) const OWNED_BY_CSTACK: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LineTable {
    /// 3.10 (PEP 626): pairs of (bytes covered, line delta).
    Pairs,
    /// 3.11 and later: the location table, entries over code units.
    Locations,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub minor: u8,
    /// In the thread state: the `_PyCFrame *` (3.11, 3.12) the current frame hangs from,
    /// or none where the thread state holds the current frame itself.
    pub tstate_cframe: Option<usize>,
    /// The current frame's pointer, in the `_PyCFrame` or else in the thread state.
    pub current_frame: usize,
    pub frames: Frames,
    pub frame_code: usize,
    pub frame_previous: usize,
    /// The instruction pointer (3.11 and later); 3.10's `f_lasti` is in [`Frames`].
    pub frame_instr: usize,
    /// Bytes of a frame that the walk reads: every field above lies in them.
    pub frame_len: usize,
    pub ob_type: usize,
    pub code_filename: usize,
    /// `co_qualname` from 3.11 on (`Model.forward`), `co_name` in 3.10.
    pub code_name: usize,
    pub code_linetable: usize,
    pub code_firstlineno: usize,
    /// Where the instructions start in the code object (3.11 and later).
    pub code_units: Option<usize>,
    /// `_co_firsttraceable` (3.11 and later, where known): a frame whose instruction
    /// pointer is before it is still being set up, and CPython's own tracebacks leave it
    /// out.
    pub code_first_traceable: Option<usize>,
    /// Bytes of a code object the walk reads.
    pub code_len: usize,
    pub line_table: LineTable,
    pub bytes_size: usize,
    pub bytes_data: usize,
    pub str_length: usize,
    pub str_state: usize,
    /// Where a compact string's characters start: all ASCII, or otherwise.
    pub str_ascii_data: usize,
    pub str_compact_data: usize,
}

impl Layout {
    /// The layout of CPython 3.`minor`, from its headers, for the versions this walk
    /// knows (3.10 to 3.13).
    pub(crate) fn of(minor: u8) -> Option<Layout> {
        // Shared by every version here: a PyObject header of 16 bytes, a PyVarObject's
        // ob_size behind it, bytes data at 32, the string state bits at 32.
        let mut l = Layout {
            minor,
            tstate_cframe: None,
            current_frame: 0,
            frames: Frames::EntryFrame { owner: 0 },
            frame_code: 0,
            frame_previous: 0,
            frame_instr: 0,
            frame_len: 0,
            ob_type: 8,
            code_filename: 0,
            code_name: 0,
            code_linetable: 0,
            code_firstlineno: 0,
            code_units: None,
            code_first_traceable: None,
            code_len: 0,
            line_table: LineTable::Locations,
            bytes_size: 16,
            bytes_data: 32,
            str_length: 16,
            str_state: 32,
            str_ascii_data: 40,
            str_compact_data: 56,
        };
        match minor {
            10 => {
                l.current_frame = 24;
                l.frames = Frames::Objects { lasti: 96 };
                l.frame_code = 32;
                l.frame_previous = 24;
                l.code_filename = 104;
                l.code_name = 112;
                l.code_linetable = 120;
                l.code_firstlineno = 40;
                l.line_table = LineTable::Pairs;
                // 3.10 and 3.11 strings still carry `wstr` (and its length).
                l.str_ascii_data = 48;
                l.str_compact_data = 72;
            }
            11 => {
                l.tstate_cframe = Some(56);
                l.current_frame = 8;
                l.frames = Frames::EntryFlag {
                    is_entry: 68,
                    owner: 69,
                };
                l.frame_code = 32;
                l.frame_previous = 48;
                l.frame_instr = 56;
                l.code_filename = 112;
                l.code_name = 128;
                l.code_linetable = 136;
                l.code_firstlineno = 72;
                l.code_units = Some(184);
                l.code_first_traceable = Some(168);
                l.str_ascii_data = 48;
                l.str_compact_data = 72;
            }
            12 => {
                l.tstate_cframe = Some(56);
                l.current_frame = 0;
                l.frames = Frames::EntryFrame { owner: 70 };
                l.frame_code = 0;
                l.frame_previous = 8;
                l.frame_instr = 56;
                l.code_filename = 112;
                l.code_name = 128;
                l.code_linetable = 136;
                l.code_firstlineno = 68;
                l.code_units = Some(192);
                l.code_first_traceable = Some(176);
            }
            13 => {
                l.current_frame = 72;
                l.frames = Frames::EntryFrame { owner: 70 };
                l.frame_code = 0;
                l.frame_previous = 8;
                l.frame_instr = 56;
                l.code_filename = 112;
                l.code_name = 128;
                l.code_linetable = 136;
                l.code_firstlineno = 68;
                l.code_units = Some(200);
                l.code_first_traceable = Some(184);
            }
            _ => return None,
        }
        l.measure();
        Some(l)
    }

    /// Sets how much of a frame and of a code object the walk copies: enough for every
    /// field it reads, in whole words (both structures are larger).
    fn measure(&mut self) {
        let frame_flags = match self.frames {
            Frames::Objects { lasti } => lasti + 4,
            Frames::EntryFlag { is_entry, owner } => is_entry.max(owner) + 1,
            Frames::EntryFrame { owner } => owner + 1,
        };
        self.frame_len = [
            self.frame_code + 8,
            self.frame_previous + 8,
            self.frame_instr + 8,
            self.ob_type + 8,
            frame_flags,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
        .next_multiple_of(8);
        self.code_len = [
            self.code_filename + 8,
            self.code_name + 8,
            self.code_linetable + 8,
            self.code_firstlineno + 4,
            self.code_first_traceable.map_or(0, |o| o + 4),
            self.ob_type + 8,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
        .next_multiple_of(8);
    }

    /// 3.13's layout from the `_Py_DebugOffsets` at `runtime` (`&_PyRuntime`), for the
    /// interpreter whose `Py_Version` is `hex_version`.
    pub(crate) fn from_debug_offsets(
        mem: &impl Memory,
        runtime: usize,
        hex_version: u64,
    ) -> Result<Layout, String> {
        let mut raw = [0u8; DEBUG_OFFSETS_LEN];
        if !mem.read(runtime, &mut raw) {
            return Err("its _PyRuntime cannot be read".into());
        }
        if &raw[..8] != b"xdebugpy" {
            return Err("its _PyRuntime does not start with the debug offsets' cookie".into());
        }
        let field = |i: usize| u64::from_le_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap());
        if field(1) >> 16 != hex_version >> 16 {
            return Err(format!(
                "its debug offsets are for version {:#x}, not {hex_version:#x}",
                field(1)
            ));
        }
        if field(2) != 0 {
            return Err(
                "it is a free-threaded build, whose frames this walk has not been \
                        tested on"
                    .into(),
            );
        }
        let mut l = Layout::of(13).expect("3.13 has a layout");
        let off = |i: usize| -> Result<usize, String> {
            let v = field(i);
            // Every field is within its structure's first few pages; anything else is a
            // table this walk misreads.
            (v < 4096)
                .then_some(v as usize)
                .ok_or_else(|| format!("its debug offset {i} is {v}, not an offset"))
        };
        l.current_frame = off(DO_TSTATE_CURRENT_FRAME)?;
        l.frame_previous = off(DO_FRAME_PREVIOUS)?;
        l.frame_code = off(DO_FRAME_EXECUTABLE)?;
        l.frame_instr = off(DO_FRAME_INSTR_PTR)?;
        let owner = off(DO_FRAME_OWNER)?;
        l.frames = Frames::EntryFrame { owner };
        let default_units = l.code_units;
        l.code_filename = off(DO_CODE_FILENAME)?;
        l.code_name = off(DO_CODE_QUALNAME)?;
        l.code_linetable = off(DO_CODE_LINETABLE)?;
        l.code_firstlineno = off(DO_CODE_FIRSTLINENO)?;
        l.code_units = Some(off(DO_CODE_ADAPTIVE)?);
        // `_co_firsttraceable` is not among the published offsets: the headers' one holds
        // only where the code object is laid out as in the default build.
        if l.code_units != default_units {
            l.code_first_traceable = None;
        }
        l.ob_type = off(DO_OB_TYPE)?;
        l.bytes_size = off(DO_BYTES_SIZE)?;
        l.bytes_data = off(DO_BYTES_DATA)?;
        l.str_state = off(DO_STR_STATE)?;
        l.str_length = off(DO_STR_LENGTH)?;
        l.str_ascii_data = off(DO_STR_ASCII_SIZE)?;
        // A compact string that is not ASCII adds its UTF-8 length and pointer (3.12 on).
        l.str_compact_data = l.str_ascii_data + 16;
        l.measure();
        Ok(l)
    }
}

// `_Py_DebugOffsets` (3.13) is a cookie and then 64-bit fields; these are field indexes.
const DO_TSTATE_CURRENT_FRAME: usize = 23;
const DO_FRAME_PREVIOUS: usize = 29;
const DO_FRAME_EXECUTABLE: usize = 30;
const DO_FRAME_INSTR_PTR: usize = 31;
const DO_FRAME_OWNER: usize = 33;
const DO_CODE_FILENAME: usize = 35;
const DO_CODE_QUALNAME: usize = 37;
const DO_CODE_LINETABLE: usize = 38;
const DO_CODE_FIRSTLINENO: usize = 39;
const DO_CODE_ADAPTIVE: usize = 43;
const DO_OB_TYPE: usize = 45;
const DO_BYTES_SIZE: usize = 65;
const DO_BYTES_DATA: usize = 66;
const DO_STR_STATE: usize = 68;
const DO_STR_LENGTH: usize = 69;
const DO_STR_ASCII_SIZE: usize = 70;
/// The fields read, through the unicode object's.
const DEBUG_OFFSETS_LEN: usize = (DO_STR_ASCII_SIZE + 1) * 8;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::memory::tests::Fake;

    #[test]
    fn every_version_reads_its_fields_in_one_copy_of_a_frame_and_of_a_code_object() {
        for minor in 10..=13 {
            let l = Layout::of(minor).unwrap();
            for f in [l.frame_code, l.frame_previous, l.frame_instr] {
                assert!(f + 8 <= l.frame_len, "3.{minor}");
            }
            for c in [l.code_filename, l.code_name, l.code_linetable, l.ob_type] {
                assert!(c + 8 <= l.code_len, "3.{minor}");
            }
        }
        assert!(Layout::of(9).is_none() && Layout::of(14).is_none());
    }

    /// The debug offsets of a default 3.13 build, as `tools/python_layout.c` prints them.
    fn debug_offsets() -> Vec<u8> {
        let mut f = vec![0u64; DEBUG_OFFSETS_LEN / 8];
        for (i, v) in [
            (1, 0x030d00f0),
            (DO_TSTATE_CURRENT_FRAME, 72),
            (DO_FRAME_PREVIOUS, 8),
            (DO_FRAME_EXECUTABLE, 0),
            (DO_FRAME_INSTR_PTR, 56),
            (DO_FRAME_OWNER, 70),
            (DO_CODE_FILENAME, 112),
            (DO_CODE_QUALNAME, 128),
            (DO_CODE_LINETABLE, 136),
            (DO_CODE_FIRSTLINENO, 68),
            (DO_CODE_ADAPTIVE, 200),
            (DO_OB_TYPE, 8),
            (DO_BYTES_SIZE, 16),
            (DO_BYTES_DATA, 32),
            (DO_STR_STATE, 32),
            (DO_STR_LENGTH, 16),
            (DO_STR_ASCII_SIZE, 40),
        ] {
            f[i] = v;
        }
        let mut raw: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        raw[..8].copy_from_slice(b"xdebugpy");
        raw
    }

    #[test]
    fn debug_offsets_of_a_default_build_give_the_headers_layout() {
        let mem = Fake::new(&[(0x1000, debug_offsets())]);
        let l = Layout::from_debug_offsets(&mem, 0x1000, 0x030d00f0).unwrap();
        assert_eq!(l, Layout::of(13).unwrap());
    }

    #[test]
    fn debug_offsets_that_do_not_fit_are_refused() {
        let good = debug_offsets();
        let mut cookie = good.clone();
        cookie[0] = b'y';
        let mut version = good.clone();
        version[8 + 2] = 0x0c; // 3.12
        let mut threads = good.clone();
        threads[16] = 1;
        let mut wild = good.clone();
        wild[DO_FRAME_OWNER * 8 + 3] = 1;
        for (what, raw) in [
            ("cookie", cookie),
            ("version", version),
            ("free-threaded", threads),
            ("an offset past 4 KiB", wild),
        ] {
            let mem = Fake::new(&[(0x1000, raw)]);
            assert!(
                Layout::from_debug_offsets(&mem, 0x1000, 0x030d00f0).is_err(),
                "{what}"
            );
        }
        assert!(Layout::from_debug_offsets(&Fake::new(&[]), 0x1000, 0x030d00f0).is_err());
    }
}
