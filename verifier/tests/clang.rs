//! Programs compiled by clang must verify: compiles `tests/bpf/*.c` with clang-19,
//! links each program section with `.text` the way libbpf does, gives every map and
//! global-data section a fake fd, and verifies. Skipped when clang-19 is missing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use bpftime_isa::opcode as op;
use bpftime_isa::uapi::{map_type, prog_type};
use bpftime_isa::{decode, Insn};
use bpftime_verifier::{verify, MapDesc, Options, ProgramInfo, RejectKind, Rejection, Verified};
use goblin::elf::Elf;

const CLANG: &str = "clang-19";

fn compile(name: &str) -> Option<Vec<u8>> {
    compile_with(name, &[])
}

fn compile_with(name: &str, extra: &[&str]) -> Option<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bpf");
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let out: PathBuf = std::env::temp_dir().join(format!(
        "bpftime-verifier-{}-{n}-{name}.o",
        std::process::id()
    ));
    let status = Command::new(CLANG)
        .args([
            "-O2",
            "-target",
            "bpf",
            "-D__TARGET_ARCH_x86",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .args(extra)
        .arg(dir.join(format!("{name}.c")))
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{CLANG} failed on {name}.c: {s}"),
        Err(e) => {
            eprintln!("skipping: {CLANG} not runnable: {e}");
            return None;
        }
    }
    let bytes = std::fs::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    Some(bytes)
}

struct Prog {
    name: String,
    insns: Vec<Insn>,
    maps: HashMap<i32, MapDesc>,
}

/// A loader's work in miniature: what libbpf would do before `BPF_PROG_LOAD`.
fn load(bytes: &[u8]) -> Vec<Prog> {
    let elf = Elf::parse(bytes).unwrap();
    let shname = |i: usize| {
        elf.shdr_strtab
            .get_at(elf.section_headers[i].sh_name)
            .unwrap_or("")
    };
    let data = |i: usize| {
        let sh = &elf.section_headers[i];
        if sh.sh_type == goblin::elf::section_header::SHT_NOBITS {
            return &[][..];
        }
        &bytes[sh.sh_offset as usize..(sh.sh_offset + sh.sh_size) as usize]
    };
    let text = (0..elf.section_headers.len()).find(|&i| shname(i) == ".text");
    let maps_sec = (0..elf.section_headers.len()).find(|&i| shname(i) == "maps");

    // Every map symbol and every global-data section is a map; fds are made up.
    let mut maps = HashMap::new();
    let mut map_fd_of_sym = HashMap::new();
    for (si, sym) in elf.syms.iter().enumerate() {
        if Some(sym.st_shndx) == maps_sec && sym.st_size == 20 {
            let d = &data(sym.st_shndx)[sym.st_value as usize..][..20];
            let w = |k: usize| u32::from_le_bytes(d[k * 4..k * 4 + 4].try_into().unwrap());
            let fd = 100 + si as i32;
            maps.insert(
                fd,
                MapDesc {
                    map_type: w(0),
                    key_size: w(1),
                    value_size: w(2),
                    max_entries: w(3),
                    flags: w(4),
                    ..MapDesc::default()
                },
            );
            map_fd_of_sym.insert(si, fd);
        }
    }
    for (i, sh) in elf.section_headers.iter().enumerate() {
        let n = shname(i);
        if n.starts_with(".rodata") || n.starts_with(".data") || n.starts_with(".bss") {
            let size = sh.sh_size as u32;
            maps.insert(
                1000 + i as i32,
                MapDesc {
                    map_type: map_type::ARRAY,
                    key_size: 4,
                    value_size: size,
                    max_entries: 1,
                    flags: 0,
                    ..MapDesc::default()
                },
            );
        }
    }

    let shdrs = &elf.section_headers;
    let relocs_for = |sec: usize| -> Vec<goblin::elf::Reloc> {
        elf.shdr_relocs
            .iter()
            .filter(|(ri, _)| shdrs[*ri].sh_info as usize == sec)
            .flat_map(|(_, rs)| rs.iter())
            .collect()
    };
    let text_insns = text
        .filter(|&t| !data(t).is_empty())
        .map(|t| decode(data(t)).unwrap())
        .unwrap_or_default();

    let mut progs = Vec::new();
    for (i, sh) in elf.section_headers.iter().enumerate() {
        let executable = sh.sh_flags & u64::from(goblin::elf::section_header::SHF_EXECINSTR) != 0;
        if !executable || Some(i) == text || sh.sh_size == 0 {
            continue;
        }
        let mut insns = decode(data(i)).unwrap();
        let base = insns.len();
        insns.extend_from_slice(&text_insns);
        // (section, index of its first slot in the linked program)
        let mut sections = vec![(i, 0usize)];
        if let Some(t) = text {
            sections.push((t, base));
        }
        for (sec, start) in sections {
            for r in relocs_for(sec) {
                let pc = start + r.r_offset as usize / 8;
                let sym = elf.syms.get(r.r_sym).unwrap();
                let sym_name = elf.strtab.get_at(sym.st_name).unwrap_or("");
                let target_sec = sym.st_shndx;
                if let Some(&fd) = map_fd_of_sym.get(&r.r_sym) {
                    insns[pc].src = op::PSEUDO_MAP_FD;
                    insns[pc].imm = fd;
                } else if Some(target_sec) == text {
                    // Call or function pointer into .text.
                    let is_call = insns[pc].code == op::CALL_INSN;
                    let target = if is_call {
                        if sym.st_type() == goblin::elf::sym::STT_SECTION {
                            (sym.st_value as i64 / 8 + insns[pc].imm as i64 + 1) as usize
                        } else {
                            sym.st_value as usize / 8
                        }
                    } else {
                        (sym.st_value as i64 + insns[pc].imm as i64) as usize / 8
                    };
                    let rel = (base + target) as i64 - (pc as i64 + 1);
                    if !is_call {
                        insns[pc].src = op::PSEUDO_FUNC;
                    }
                    insns[pc].imm = rel as i32;
                } else if maps.contains_key(&(1000 + target_sec as i32)) {
                    let off = sym.st_value as i64 + insns[pc].imm as i64;
                    insns[pc].src = op::PSEUDO_MAP_VALUE;
                    insns[pc].imm = 1000 + target_sec as i32;
                    insns[pc + 1].imm = off as i32;
                } else {
                    panic!("unhandled relocation at {pc} against {sym_name}");
                }
            }
        }
        // Only keep .text when something reaches into it, like libbpf.
        let uses_text = insns[..base].iter().any(|i| {
            (i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO)
                || (i.is_lddw() && i.src == op::PSEUDO_FUNC)
        });
        if !uses_text {
            insns.truncate(base);
        }
        progs.push(Prog {
            name: shname(i).to_string(),
            insns,
            maps: maps.clone(),
        });
    }
    progs
}

fn verify_prog(p: &Prog, gpu: bool, log_level: u32) -> Result<Verified, Rejection> {
    let lookup = |fd: i32| p.maps.get(&fd).cloned();
    let info = ProgramInfo {
        insns: &p.insns,
        prog_type: prog_type::KPROBE,
        gpu,
        maps: &lookup,
        mem_len: 0,
    };
    verify(
        &info,
        &Options {
            log_level,
            ..Options::default()
        },
    )
}

fn accepts(name: &str) {
    accepts_with(name, &[]);
}

fn accepts_with(name: &str, extra: &[&str]) {
    let Some(bytes) = compile_with(name, extra) else {
        return;
    };
    let progs = load(&bytes);
    assert!(!progs.is_empty(), "{name}: no program sections");
    for p in &progs {
        match verify_prog(p, false, 0) {
            Ok(v) => eprintln!(
                "{name}/{}: {} insns, processed {}, states {}, peak {}",
                p.name,
                p.insns.len(),
                v.insns_processed,
                v.states,
                v.peak_states
            ),
            Err(e) => {
                let full = verify_prog(p, false, 2).unwrap_err();
                let _ = e;
                panic!("{name}/{} rejected:\n{}", p.name, full.log());
            }
        }
    }
}

#[test]
fn counter_with_hash_map() {
    accepts("counter");
}

#[test]
fn ringbuf_event_with_user_string() {
    accepts("ringbuf");
}

#[test]
fn histogram_loop_and_masked_index() {
    accepts("histogram");
}

#[test]
fn subprograms_bpf_loop_and_printk() {
    accepts("calls");
}

#[test]
fn string_scan_and_perf_output() {
    accepts("strings");
}

#[test]
fn parsing_with_data_dependent_loop() {
    accepts("parse");
}

#[test]
fn switch_and_ringbuf_in_loop() {
    accepts("switch");
}

fn rejects(name: &str) -> Option<Rejection> {
    let bytes = compile(name)?;
    let progs = load(&bytes);
    let e = verify_prog(&progs[0], false, 0).expect_err("must be rejected");
    eprintln!("{name}: {}", e.log());
    Some(e)
}

#[test]
fn index_bounded_only_below_rejected() {
    if let Some(e) = rejects("bad_index") {
        let bounded = matches!(
            e.kind,
            RejectKind::RegionOutOfBounds { .. } | RejectKind::UnboundedOffset { .. }
        );
        assert!(bounded, "{}", e.log());
    }
}

#[test]
fn lookup_used_without_null_check_rejected() {
    if let Some(e) = rejects("bad_null") {
        assert!(
            matches!(e.kind, RejectKind::InvalidMemAccess { .. }),
            "{}",
            e.log()
        );
    }
}

/// `-mcpu=v3` code (32-bit subregisters, `jmp32`), which libbpf tools commonly build.
#[test]
fn cpu_v3_codegen() {
    for name in [
        "counter",
        "ringbuf",
        "histogram",
        "calls",
        "strings",
        "parse",
        "switch",
    ] {
        accepts_with(name, &["-mcpu=v3"]);
    }
}

/// `-mcpu=v4` code (sign-extending loads and moves, `gotol`, signed division).
#[test]
fn cpu_v4_codegen() {
    for name in [
        "counter",
        "ringbuf",
        "histogram",
        "calls",
        "strings",
        "parse",
        "switch",
    ] {
        accepts_with(name, &["-mcpu=v4"]);
    }
}

#[test]
fn cpu_only_helper_rejected_in_gpu_mode() {
    // ringbuf_reserve and get_current_comm have no GPU side.
    let Some(bytes) = compile("ringbuf") else {
        return;
    };
    let e = verify_prog(&load(&bytes)[0], true, 0).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::HelperNotOnGpu { id: 131 | 16, .. }),
        "{}",
        e.log()
    );
    // get_current_pid_tgid answers the host process's ids on the GPU too.
    let Some(bytes) = compile("counter") else {
        return;
    };
    verify_prog(&load(&bytes)[0], true, 0).unwrap();
}
