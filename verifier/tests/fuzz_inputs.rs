//! The fuzz target's body (`fuzz/check.rs`) over deterministic inputs, so that
//! stable CI runs it: random bytes, random well-formed instructions, and the
//! differential corpus's programs with a few bytes flipped.

#[path = "../fuzz/check.rs"]
mod check;
mod oracle;

use bpftime_isa::encode;
use oracle::mutate::Rng;

/// Opcodes the ISA defines, so random programs get past decoding often.
const CODES: &[u8] = &[
    0x07, 0x0f, 0x17, 0x1f, 0x27, 0x2f, 0x37, 0x3f, 0x47, 0x4f, 0x57, 0x5f, 0x67, 0x6f, 0x77, 0x7f,
    0x87, 0x97, 0x9f, 0xa7, 0xaf, 0xb7, 0xbf, 0xc7, 0xcf, 0xd4, 0xdc, 0xd7, 0x04, 0x0c, 0x14, 0x1c,
    0x24, 0x34, 0x44, 0x54, 0x64, 0x74, 0x84, 0x94, 0xa4, 0xb4, 0xbc, 0xc4, 0x61, 0x69, 0x71, 0x79,
    0x81, 0x89, 0x91, 0x62, 0x6a, 0x72, 0x7a, 0x63, 0x6b, 0x73, 0x7b, 0xc3, 0xdb, 0x05, 0x06, 0x15,
    0x1d, 0x25, 0x2d, 0x35, 0x45, 0x55, 0x5d, 0x65, 0xa5, 0xb5, 0xc5, 0xd5, 0x16, 0x1e, 0x26, 0xa6,
    0x85, 0x8d, 0x95, 0x18, 0x20,
];

fn random_bytes(rng: &mut Rng) -> Vec<u8> {
    let n = 2 + 8 * (1 + rng.below(40)) + rng.below(8);
    (0..n).map(|_| rng.next() as u8).collect()
}

fn random_insns(rng: &mut Rng) -> Vec<u8> {
    let mut v = vec![rng.next() as u8, rng.next() as u8];
    let n = 1 + rng.below(48);
    for k in 0..n {
        let code = if k + 1 == n { 0x95 } else { rng.pick(CODES) };
        let regs = (rng.below(11) as u8) | ((rng.below(11) as u8) << 4);
        let off: i16 = rng.pick(&[0, 1, 2, -1, -2, -8, 8, 16, -512, 3]);
        let imm: i32 = rng.pick(&[
            0, 1, -1, 8, 16, 32, 63, 64, 1, 5, 12, 130, 131, 132, 181, -8,
        ]);
        v.push(code);
        v.push(regs);
        v.extend_from_slice(&off.to_le_bytes());
        v.extend_from_slice(&imm.to_le_bytes());
        if code == 0x18 {
            v.extend_from_slice(&[0; 8]);
        }
    }
    v
}

#[test]
fn the_fuzz_body_survives_random_programs() {
    let mut rng = Rng::seeded("fuzz_inputs", 1);
    for _ in 0..2000 {
        check::check(&random_bytes(&mut rng));
    }
    for _ in 0..2000 {
        check::check(&random_insns(&mut rng));
    }
}

#[test]
fn the_fuzz_body_survives_corrupted_corpus_programs() {
    let mut rng = Rng::seeded("fuzz_inputs", 2);
    for e in oracle::load_all() {
        let code = encode(&e.insns);
        for _ in 0..3 {
            // Map set 1 has maps at the fds the corpus uses.
            let sel = (rng.next() as u8 & !0x0c) | 0x04;
            let mut input = vec![sel, rng.next() as u8];
            input.extend_from_slice(&code);
            for _ in 0..1 + rng.below(4) {
                let at = 2 + rng.below(input.len() - 2);
                input[at] ^= 1 << rng.below(8);
            }
            check::check(&input);
        }
    }
}

/// Seeds for the real fuzzer from the corpus: `SEEDS=dir cargo test --release
/// -p bpftime-verifier --test fuzz_inputs -- --ignored write_seeds`, then
/// `cargo +nightly fuzz run verify <empty dir> <seeds dir>` in `fuzz/`.
#[test]
#[ignore]
fn write_seeds() {
    let dir = std::env::var("SEEDS").expect("SEEDS=directory");
    std::fs::create_dir_all(&dir).unwrap();
    for (n, e) in oracle::load_all().iter().enumerate() {
        // kprobe with map set 1, and the same bytes as a conformance program.
        for sel in [0x04u8, 0x05] {
            let mut input = vec![sel, 64];
            input.extend_from_slice(&encode(&e.insns));
            std::fs::write(format!("{dir}/{n}-{sel}"), input).unwrap();
        }
    }
}
