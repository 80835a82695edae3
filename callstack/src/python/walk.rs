//! The walk over a thread's Python frames, innermost first: what is copied at capture time.

use super::layout::{Frames, Layout};
use super::memory::Memory;

/// Python frames kept per stack; a deeper stack (or a cycle) is cut.
pub(crate) const MAX_PY_FRAMES: usize = 256;

/// One frame as the walk found it, before its code object is looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawFrame {
    pub code: usize,
    /// 3.10: `f_lasti`; later: the instruction pointer.
    pub instr: u64,
    /// `_PyInterpreterFrame.owner` (3.11 and later).
    pub owner: u8,
    /// 3.11: the frame a call of the evaluation loop began with.
    pub entry: bool,
}

/// Whether the walk reached the outermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Walked {
    Whole,
    /// Cut short: too deep, a cycle, or something that cannot be read or is not a frame.
    Cut,
}

/// Appends the frames of the thread whose state is at `tstate` to `out`, innermost
/// first. `frame_type` is `&PyFrame_Type` (3.10, where frames are objects).
pub(crate) fn walk(
    mem: &impl Memory,
    layout: &Layout,
    tstate: usize,
    frame_type: usize,
    out: &mut Vec<RawFrame>,
) -> Walked {
    let holder = match layout.tstate_cframe {
        Some(cframe) => match mem.word(tstate.wrapping_add(cframe)) {
            Some(0) => return Walked::Whole,
            Some(p) => p,
            None => return Walked::Cut,
        },
        None => tstate,
    };
    let Some(mut at) = mem.word(holder.wrapping_add(layout.current_frame)) else {
        return Walked::Cut;
    };
    // Brent's cycle check: a saved frame that the walk comes back to is a cycle, found
    // within three times its length (past any tail), with no memory beyond one pointer.
    let (mut saved, mut power, mut steps) = (at, 1usize, 0usize);
    let first = out.len();
    while at != 0 {
        if out.len() - first == MAX_PY_FRAMES || !at.is_multiple_of(8) {
            return Walked::Cut;
        }
        let Some(frame) = mem.span(at, layout.frame_len) else {
            return Walked::Cut;
        };
        let code = frame.word(layout.frame_code);
        let raw = match layout.frames {
            Frames::Objects { lasti } => {
                if frame.word(layout.ob_type) != frame_type {
                    return Walked::Cut;
                }
                RawFrame {
                    code,
                    instr: frame.int(lasti) as i64 as u64,
                    owner: 0,
                    entry: true,
                }
            }
            Frames::EntryFlag { is_entry, owner } => RawFrame {
                code,
                instr: frame.word(layout.frame_instr) as u64,
                owner: frame.byte(owner),
                entry: frame.byte(is_entry) != 0,
            },
            Frames::EntryFrame { owner } => RawFrame {
                code,
                instr: frame.word(layout.frame_instr) as u64,
                owner: frame.byte(owner),
                entry: false,
            },
        };
        out.push(raw);
        at = frame.word(layout.frame_previous);
        if at == saved {
            return Walked::Cut;
        }
        steps += 1;
        if steps == power {
            (saved, power, steps) = (at, power * 2, 0);
        }
    }
    Walked::Whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::memory::tests::Fake;

    /// A 3.12 frame at `at`: its code and the frame it links to.
    fn frame_312(code: usize, previous: usize, owner: u8) -> Vec<u8> {
        let mut f = vec![0u8; 72];
        f[0..8].copy_from_slice(&code.to_le_bytes());
        f[8..16].copy_from_slice(&previous.to_le_bytes());
        f[56..64].copy_from_slice(&(code + 192).to_le_bytes());
        f[70] = owner;
        f
    }

    /// A 3.12 thread state at 0x1000 whose cframe (at 0x2000) points at `current`.
    fn thread(current: usize) -> Vec<(usize, Vec<u8>)> {
        let mut tstate = vec![0u8; 64];
        tstate[56..64].copy_from_slice(&0x2000usize.to_le_bytes());
        vec![(0x1000, tstate), (0x2000, current.to_le_bytes().to_vec())]
    }

    fn walk_312(mem: &Fake, tstate: usize) -> (Walked, Vec<RawFrame>) {
        let mut out = Vec::new();
        let w = walk(mem, &Layout::of(12).unwrap(), tstate, 0, &mut out);
        (w, out)
    }

    #[test]
    fn frames_come_innermost_first_until_the_outermost() {
        let mut mem = thread(0x3000);
        mem.push((0x3000, frame_312(0xa000, 0x3100, 0)));
        mem.push((0x3100, frame_312(0xb000, 0x3200, 0)));
        mem.push((0x3200, frame_312(0xc000, 0, 3)));
        let (w, out) = walk_312(&Fake::new(&mem), 0x1000);
        assert_eq!(w, Walked::Whole);
        let codes: Vec<usize> = out.iter().map(|f| f.code).collect();
        assert_eq!(codes, [0xa000, 0xb000, 0xc000]);
        assert_eq!(out[2].owner, 3);
    }

    #[test]
    fn a_cycle_in_previous_is_cut_within_three_times_its_length() {
        for len in [1usize, 2, 5, 40] {
            let mut mem = thread(0x3000);
            for i in 0..len {
                let next = 0x3000 + ((i + 1) % len) * 0x100;
                mem.push((0x3000 + i * 0x100, frame_312(0xa000 + i, next, 0)));
            }
            let (w, out) = walk_312(&Fake::new(&mem), 0x1000);
            assert_eq!(w, Walked::Cut, "cycle of {len}");
            assert!(out.len() <= 3 * len, "cycle of {len}: {} frames", out.len());
        }
        // A cycle behind a long tail is still found, and well before the bound.
        let mut mem = thread(0x3000);
        for i in 0..100 {
            let next = if i == 99 {
                0x3000 + 90 * 0x100
            } else {
                0x3000 + (i + 1) * 0x100
            };
            mem.push((0x3000 + i * 0x100, frame_312(0xa000, next, 0)));
        }
        let (w, out) = walk_312(&Fake::new(&mem), 0x1000);
        assert_eq!(w, Walked::Cut);
        assert!(out.len() < MAX_PY_FRAMES, "{}", out.len());
    }

    #[test]
    fn a_deep_stack_is_cut_at_the_bound() {
        let n = MAX_PY_FRAMES + 10;
        let mut mem = thread(0x10000);
        for i in 0..n {
            let next = if i + 1 == n {
                0
            } else {
                0x10000 + (i + 1) * 0x100
            };
            mem.push((0x10000 + i * 0x100, frame_312(0xa000, next, 0)));
        }
        let (w, out) = walk_312(&Fake::new(&mem), 0x1000);
        assert_eq!((w, out.len()), (Walked::Cut, MAX_PY_FRAMES));
    }

    #[test]
    fn a_bogus_thread_state_or_frame_pointer_ends_the_walk() {
        // No thread state there at all.
        let (w, out) = walk_312(&Fake::new(&thread(0x3000)), 0xdead_0000);
        assert_eq!((w, out.len()), (Walked::Cut, 0));
        // A current frame that cannot be read, or is not aligned.
        for current in [0x9999_0000usize, 0x3003] {
            let mut mem = thread(current);
            mem.push((0x3000, frame_312(0xa000, 0, 0)));
            let (w, out) = walk_312(&Fake::new(&mem), 0x1000);
            assert_eq!((w, out.len()), (Walked::Cut, 0), "{current:#x}");
        }
        // A thread state with no cframe, or no current frame: no frames, nothing wrong.
        let mut idle = thread(0);
        let (w, out) = walk_312(&Fake::new(&idle), 0x1000);
        assert_eq!((w, out.len()), (Walked::Whole, 0));
        idle[0].1[56..64].fill(0);
        let (w, out) = walk_312(&Fake::new(&idle), 0x1000);
        assert_eq!((w, out.len()), (Walked::Whole, 0));
    }

    #[test]
    fn random_memory_ends_every_walk_within_the_bound() {
        // Pages of random words, many of them pointers back into the pages: whatever the
        // walk follows, it ends, without a panic, within its bound, in every layout, and
        // so does the naming of what it found.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = 0x10_0000usize;
        let size = 1 << 16;
        let mut named = 0;
        for round in 0..50 {
            let words: Vec<u8> = (0..size / 8)
                .flat_map(|_| {
                    let r = next();
                    // Pointers to 8 places, one of them taken for the code type below,
                    // so that some random frames pass for Python's and get named.
                    let w = if r % 3 == 0 {
                        r
                    } else {
                        base as u64 + (r % 8) * 8192
                    };
                    w.to_le_bytes()
                })
                .collect();
            let mem = Fake::new(&[(base, words)]);
            for minor in 10..=13 {
                let layout = Layout::of(minor).unwrap();
                let mut out = Vec::new();
                let tstate = (base + (next() as usize % size)) & !7;
                walk(&mem, &layout, tstate, base, &mut out);
                assert!(out.len() <= MAX_PY_FRAMES, "round {round}, 3.{minor}");
                // And what the frames name, with any word taken for the code type.
                let interp = crate::python::Interpreter::for_tests(layout, base);
                let mut codes = crate::python::Codes::default();
                let mut entries = Vec::new();
                codes.add(&mem, &interp, &out, &mut entries);
                assert!(entries.len() <= 2 * out.len());
                named += codes.get(0).is_some() as usize;
            }
        }
        assert!(named > 0, "no random frame got as far as its names");
    }

    #[test]
    fn a_310_frame_that_is_not_a_frame_object_ends_the_walk() {
        let l = Layout::of(10).unwrap();
        let frame = |ty: usize, back: usize, lasti: i32| {
            let mut f = vec![0u8; l.frame_len];
            f[8..16].copy_from_slice(&ty.to_le_bytes());
            f[24..32].copy_from_slice(&back.to_le_bytes());
            f[32..40].copy_from_slice(&0xa000usize.to_le_bytes());
            f[96..100].copy_from_slice(&lasti.to_le_bytes());
            f
        };
        let mut tstate = vec![0u8; 32];
        tstate[24..32].copy_from_slice(&0x3000usize.to_le_bytes());
        let mem = Fake::new(&[
            (0x1000, tstate),
            (0x3000, frame(0x77, 0x3100, 5)),
            (0x3100, frame(0x66, 0, 1)),
        ]);
        let mut out = Vec::new();
        assert_eq!(walk(&mem, &l, 0x1000, 0x77, &mut out), Walked::Cut);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].instr, out[0].entry), (5, true));
    }
}
