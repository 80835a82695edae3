//! Random programs must never panic the verifier, and what it accepts must be
//! well-formed (a cheap stand-in for the fuzz target, run on every `cargo test`).

mod common;

use bpftime_isa::uapi::prog_type;
use bpftime_isa::Insn;
use bpftime_verifier::PROG_TYPE_CONFORMANCE;
use common::run_with;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

const CODES: &[u8] = &[
    0x07, 0x0f, 0x17, 0x1f, 0x27, 0x2f, 0x37, 0x3f, 0x47, 0x4f, 0x57, 0x5f, 0x67, 0x6f, 0x77, 0x7f,
    0x87, 0x97, 0x9f, 0xa7, 0xaf, 0xb7, 0xbf, 0xc7, 0xcf, 0xd4, 0xdc, 0x04, 0x0c, 0x14, 0x1c, 0x24,
    0x34, 0x44, 0x54, 0x64, 0x74, 0x84, 0x94, 0xa4, 0xb4, 0xbc, 0xc4, 0x61, 0x69, 0x71, 0x79, 0x81,
    0x89, 0x91, 0x62, 0x6a, 0x72, 0x7a, 0x63, 0x6b, 0x73, 0x7b, 0xc3, 0xdb, 0x05, 0x15, 0x1d, 0x25,
    0x2d, 0x35, 0x45, 0x55, 0x5d, 0x65, 0xa5, 0xb5, 0xc5, 0xd5, 0x16, 0x1e, 0x26, 0xa6, 0x85, 0x95,
    0x18, 0xff, 0x20,
];
const HELPERS: &[i32] = &[
    1, 2, 3, 4, 5, 6, 12, 14, 16, 25, 27, 87, 88, 112, 113, 130, 131, 132, 133, 181, 505, 9999,
];
const IMMS: &[i32] = &[
    0,
    1,
    -1,
    4,
    7,
    8,
    15,
    16,
    63,
    64,
    168,
    255,
    512,
    -8,
    -16,
    -512,
    i32::MIN,
    i32::MAX,
];
const OFFS: &[i16] = &[0, 1, -1, 2, -2, 4, -4, 8, -8, 16, -16, -512, 160];

fn program(rng: &mut Rng) -> Vec<Insn> {
    let n = 1 + (rng.next() % 24) as usize;
    let mut v = Vec::with_capacity(n + 2);
    while v.len() < n {
        let code = rng.pick(CODES);
        // Mostly the registers a program has set up, so some programs get far.
        let dst = rng.pick(&[0u8, 2, 3, 4, 5, 6, 0, 2, 3, 1, 10]);
        let src = rng.pick(&[1u8, 10, 0, 2, 3, 6]);
        let is_jump = matches!(code & 7, 5 | 6);
        let is_alu = matches!(code & 7, 4 | 7);
        let off = if is_jump {
            rng.pick(&[0i16, 1, 1, 2, 3, -2])
        } else if is_alu {
            0
        } else {
            rng.pick(OFFS)
        };
        match code {
            0x85 => {
                let pseudo = rng.next().is_multiple_of(4);
                let imm = if pseudo {
                    rng.pick(OFFS) as i32
                } else {
                    rng.pick(HELPERS)
                };
                v.push(Insn::new(code, 0, pseudo as u8, 0, imm));
            }
            0x18 => {
                let src = rng.pick(&[0u8, 1, 2, 4]);
                let imm = if src == 4 {
                    rng.pick(OFFS) as i32
                } else {
                    (rng.next() % 12) as i32
                };
                v.push(Insn::new(code, dst, src, 0, imm));
                v.push(Insn::new(0, 0, 0, 0, rng.pick(&[0, 0, 4, 8, 100])));
            }
            0xc3 | 0xdb => {
                let imm = rng.pick(&[0x00, 0x01, 0x40, 0x41, 0x50, 0xa0, 0xe1, 0xf1, 0x33]);
                v.push(Insn::new(code, dst, src, off, imm));
            }
            c if c & 0x08 != 0 && matches!(c & 7, 4..=7) => {
                v.push(Insn::new(code, dst, src, off, 0))
            }
            c if matches!(c & 7, 1 | 3) => v.push(Insn::new(code, dst, src, off, 0)),
            0x95 | 0x87 | 0x84 => v.push(Insn::new(code, 0, 0, 0, 0)),
            0xd4 | 0xdc => v.push(Insn::new(code, dst, 0, 0, rng.pick(&[16, 32, 64]))),
            _ => v.push(Insn::new(code, dst, 0, off, rng.pick(IMMS))),
        }
    }
    v.push(Insn::new(0xb7, 0, 0, 0, 0));
    v.push(Insn::new(0x95, 0, 0, 0, 0));
    v
}

#[test]
fn random_programs_never_panic() {
    let seed = std::env::var("BPFTIME_VERIFIER_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15);
    let mut rng = Rng(seed);
    let mut accepted = 0;
    let mut kinds = std::collections::BTreeMap::new();
    // More with BPFTIME_VERIFIER_RANDOM=n (with BPFTIME_VERIFIER_DUMP, an oracle run).
    let n: usize = std::env::var("BPFTIME_VERIFIER_RANDOM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30_000);
    for k in 0..n {
        let p = program(&mut rng);
        let ty = if k % 5 == 0 {
            PROG_TYPE_CONFORMANCE
        } else {
            prog_type::KPROBE
        };
        match run_with(&p, ty, k % 7 == 0) {
            Ok(_) => accepted += 1,
            Err(e) => {
                let name = format!("{:?}", e.kind);
                let name = name.split([' ', '{']).next().unwrap_or("").to_string();
                *kinds.entry(name).or_insert(0usize) += 1;
            }
        }
    }
    // Not a correctness bound, only a sign the generator reaches past the first insn.
    assert!(accepted > 50, "accepted {accepted}, rejections {kinds:?}");
}
