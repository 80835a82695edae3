//! Constant strings (`bpf_snprintf`'s format, `bpf_strncmp`'s second string), checked at
//! load as the kernel checks them: each case pins our verdict and reason, and, where the
//! kernel can be asked (root), the kernel's verdict and message, which must agree.
//!
//! The maps are made as libbpf makes `.rodata`: an array of one element, created with
//! `BPF_F_RDONLY_PROG`, filled, then frozen (`BPF_MAP_FREEZE`) before the program loads;
//! the kernel gets exactly that, ours the same facts through `MapDesc`.

mod oracle;

#[path = "../../tests/src/kernel_version.rs"]
#[allow(dead_code)]
mod kernel_version;

use std::sync::Arc;

use bpftime_isa::bprintf::FormatError;
use bpftime_verifier::{verify, Options, ProgramInfo, RejectKind, Rejection, Verified};
use kernel_version::{for_running, Row, Version};
use oracle::{kernel, Entry};

/// `BPF_F_RDONLY_PROG`, as the map directives spell it.
const RDONLY_PROG: &str = "0x80";

/// The kernel's `ENOTSUPP` (not `EOPNOTSUPP`).
const ENOTSUPP: i32 = 524;

/// `bpf_snprintf(out, 64, fmt, data, data_len)`: `pre` runs first (it may call helpers,
/// and leaves what it computes in r6), `fmt` leaves the format in r3 and `len` the data
/// length in r5; the data is 112 bytes of stack at r4 (readable, as privileged loaders
/// may read stack they never wrote).
fn snprintf(maps: &str, pre: &str, fmt: &str, len: &str) -> String {
    format!(
        "#@ type kprobe\n{maps}\n{pre}\nmov %r1, %r10\nadd %r1, -176\nmov %r2, 64\n{fmt}\n\
         mov %r4, %r10\nadd %r4, -112\n{len}\ncall 165\nmov %r0, 0\nexit\n"
    )
}

/// The usual `.rodata`-like map: an array of one 32-byte value, `BPF_F_RDONLY_PROG`.
fn rodata() -> String {
    format!("#@ map fmt array 4 32 1 {RDONLY_PROG}")
}

const FMT: &str = "ldmapval %r3, fmt, 0";
const TWO_ARGS: &str = "mov %r5, 16";

/// `bpf_strncmp(stack, 4, s)`.
fn strncmp(s: &str) -> String {
    format!(
        "#@ type kprobe\n{}\nstdw [%r10-8], 0\nmov %r1, %r10\nadd %r1, -8\nmov %r2, 4\n{s}\n\
         call 182\nmov %r0, 0\nexit\n",
        rodata().replace("fmt", "s")
    )
}

/// A frozen map's value: `bytes`, NUL-padded to 32.
fn value(bytes: &[u8]) -> Arc<[u8]> {
    let mut v = bytes.to_vec();
    v.resize(32, 0);
    v.into()
}

/// `text` as an entry whose first map holds `contents` (`None`: left as it was made) and
/// is frozen if `frozen`.
fn entry(text: &str, frozen: bool, contents: Option<Arc<[u8]>>) -> Entry {
    let mut e = oracle::parse("const_str", text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    if let Some(m) = e.maps.first_mut() {
        m.desc.frozen = frozen;
        m.desc.frozen_value = contents;
    }
    e
}

fn frozen(text: &str, contents: &[u8]) -> Entry {
    entry(text, true, Some(value(contents)))
}

/// A map value pointer from a lookup with key `r6` (pre must set it) in `map`, null
/// checked unless `checked` is false; the program exits early on NULL.
fn looked_up(map: &str, key_pre: &str, checked: bool) -> String {
    let check = if checked {
        "jne %r0, 0, +2\nmov %r0, 0\nexit\n"
    } else {
        ""
    };
    let pre = format!(
        "{key_pre}\nstxw [%r10-180], %r6\nldmap %r1, fmt\nmov %r2, %r10\nadd %r2, -180\n\
         call 1\n{check}mov %r6, %r0"
    );
    snprintf(map, &pre, "mov %r3, %r6", TWO_ARGS)
}

struct Case {
    name: &'static str,
    entry: Entry,
    ours: Result<(), RejectKind>,
    /// What a 6.18 kernel answers: accepted, or the errno and the log's reason line.
    kernel: Result<(), (i32, &'static str)>,
}

fn cases() -> Vec<Case> {
    use RejectKind as K;
    let invalid = |error| Err(K::InvalidFormat { error });
    let readonly = Err(K::NotReadonlyMap { reg: 3 });
    let k_readonly = Err((libc::EACCES, "R3 does not point to a readonly map'"));
    let k_invalid = Err((libc::EINVAL, "Invalid format string"));
    let random_bit = "call 7\nmov %r6, %r0\nand %r6, 1";
    vec![
        Case {
            name: "valid format in a frozen read-only array",
            entry: frozen(&snprintf(&rodata(), "", FMT, TWO_ARGS), b"%d %d"),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            name: "invalid conversion %y",
            entry: frozen(&snprintf(&rodata(), "", FMT, TWO_ARGS), b"%y"),
            ours: invalid(FormatError::BadConversion(1)),
            kernel: k_invalid,
        },
        Case {
            name: "three conversions, two arguments",
            entry: frozen(&snprintf(&rodata(), "", FMT, TWO_ARGS), b"%d %d %d"),
            ours: invalid(FormatError::TooFewArgs(6)),
            kernel: k_invalid,
        },
        Case {
            name: "map not frozen",
            // Filled but never frozen: the bytes are there, and still do not count.
            entry: entry(
                &snprintf(&rodata(), "", FMT, TWO_ARGS),
                false,
                Some(value(b"%d")),
            ),
            ours: readonly.clone(),
            kernel: k_readonly,
        },
        Case {
            name: "frozen map that programs may write",
            entry: frozen(
                &snprintf("#@ map fmt array 4 32 1", "", FMT, TWO_ARGS),
                b"%d",
            ),
            ours: readonly.clone(),
            kernel: k_readonly,
        },
        Case {
            name: "format on the stack",
            entry: frozen(
                &snprintf(
                    &rodata(),
                    "stdw [%r10-184], 0x6425",
                    "mov %r3, %r10\nadd %r3, -184",
                    TWO_ARGS,
                ),
                b"%d",
            ),
            ours: Err(K::HelperArgType {
                reg: 3,
                found: "fp",
                expected: "map_value",
            }),
            kernel: Err((libc::EACCES, "R3 type=fp expected=map_value")),
        },
        Case {
            name: "format pointer is a number",
            entry: frozen(&snprintf(&rodata(), "", "mov %r3, 0", TWO_ARGS), b"%d"),
            ours: Err(K::HelperArgType {
                reg: 3,
                found: "scalar",
                expected: "map_value",
            }),
            kernel: Err((libc::EACCES, "R3 type=scalar expected=map_value")),
        },
        Case {
            name: "offset not constant",
            entry: frozen(
                &snprintf(
                    &rodata(),
                    random_bit,
                    "ldmapval %r3, fmt, 0\nadd %r3, %r6",
                    TWO_ARGS,
                ),
                b"%d",
            ),
            ours: Err(K::NotConstantAddress { reg: 3 }),
            kernel: Err((libc::EACCES, "R3 is not a constant address'")),
        },
        Case {
            name: "constant offset reached by arithmetic",
            entry: frozen(
                &snprintf(
                    &rodata(),
                    "call 7\nmov %r6, %r0\nand %r6, 0",
                    "ldmapval %r3, fmt, 0\nadd %r3, %r6\nadd %r3, 3",
                    TWO_ARGS,
                ),
                b"abc%d",
            ),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            // "%d%d%d" from offset 8 of "%d%d%d%d%d%d%d": read where the pointer is.
            name: "format read from the pointer's offset",
            entry: frozen(
                &snprintf(&rodata(), "", "ldmapval %r3, fmt, 8", TWO_ARGS),
                b"%d%d%d%d%d%d%d",
            ),
            ours: invalid(FormatError::TooFewArgs(4)),
            kernel: k_invalid,
        },
        Case {
            name: "no NUL before the value ends",
            entry: entry(
                &snprintf(&rodata(), "", "ldmapval %r3, fmt, 16", TWO_ARGS),
                true,
                Some(Arc::from(&b"%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d"[..])),
            ),
            ours: Err(K::StringNotTerminated),
            kernel: Err((libc::EINVAL, "string is not zero-terminated")),
        },
        Case {
            name: "offset at the value's end",
            entry: frozen(
                &snprintf(&rodata(), "", "ldmapval %r3, fmt, 0\nadd %r3, 32", TWO_ARGS),
                b"%d",
            ),
            ours: Err(K::RegionOutOfBounds {
                region: "map value",
                region_size: 32,
                off_min: 32,
                off_max: 32,
                size: 1,
            }),
            kernel: Err((
                libc::EACCES,
                "R3 min value is outside of the allowed memory range",
            )),
        },
        Case {
            name: "lookup in a frozen read-only array of one element",
            entry: frozen(&looked_up(&rodata(), "mov %r6, 0", true), b"%d%d"),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            name: "lookup in an array of two elements",
            entry: entry(
                &looked_up(
                    &format!("#@ map fmt array 4 32 2 {RDONLY_PROG}"),
                    "mov %r6, 0",
                    true,
                ),
                true,
                Some(value(b"%d%d")),
            ),
            ours: Err(K::DirectValueAccessFailed),
            kernel: Err((ENOTSUPP, "direct value access on string failed")),
        },
        Case {
            name: "lookup in a frozen read-only hash map",
            entry: entry(
                &looked_up(
                    &format!("#@ map fmt hash 4 32 2 {RDONLY_PROG}"),
                    "mov %r6, 0",
                    true,
                ),
                true,
                None,
            ),
            ours: Err(K::NoDirectValueAccess),
            kernel: Err((
                libc::EACCES,
                "no direct value access support for this map type",
            )),
        },
        Case {
            name: "lookup result not checked for NULL",
            entry: frozen(&looked_up(&rodata(), "call 7\nmov %r6, %r0", false), b"%d"),
            ours: Err(K::HelperArgType {
                reg: 3,
                found: "map_value_or_null",
                expected: "map_value",
            }),
            kernel: Err((libc::EACCES, "R3 type=map_value_or_null expected=map_value")),
        },
        Case {
            name: "data_len not a multiple of 8",
            entry: frozen(&snprintf(&rodata(), "", FMT, "mov %r5, 12"), b"%d"),
            ours: Err(K::SnprintfDataLen { len: 12 }),
            // The kernel gives no reason: its log ends at the call.
            kernel: Err((libc::EINVAL, "8: (85) call bpf_snprintf#165")),
        },
        Case {
            name: "no data and no conversion",
            entry: frozen(
                &snprintf(&rodata(), "", FMT, "mov %r4, 0\nmov %r5, 0"),
                b"no args",
            ),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            name: "no data for a conversion",
            entry: frozen(
                &snprintf(&rodata(), "", FMT, "mov %r4, 0\nmov %r5, 0"),
                b"%d",
            ),
            ours: invalid(FormatError::TooFewArgs(0)),
            kernel: k_invalid,
        },
        Case {
            // Fourteen arguments are more than the helper takes at run time, but the
            // load-time check only counts conversions.
            name: "more data than the helper takes",
            entry: frozen(&snprintf(&rodata(), "", FMT, "mov %r5, 112"), b"%d"),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            // r5 is 8 or 24: its known bits say 8, one argument.
            name: "data_len counted by its known bits (one conversion)",
            entry: frozen(
                &snprintf(
                    &rodata(),
                    "call 7\nmov %r6, %r0\nand %r6, 16\nor %r6, 8",
                    FMT,
                    "mov %r5, %r6",
                ),
                b"%d",
            ),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            name: "data_len counted by its known bits (two conversions)",
            entry: frozen(
                &snprintf(
                    &rodata(),
                    "call 7\nmov %r6, %r0\nand %r6, 16\nor %r6, 8",
                    FMT,
                    "mov %r5, %r6",
                ),
                b"%d%d",
            ),
            ours: invalid(FormatError::TooFewArgs(2)),
            kernel: k_invalid,
        },
        Case {
            // bpf_trace_vprintk's format is plain memory to the kernel, checked when
            // the helper runs: a stack string is fine.
            name: "trace_vprintk with a format on the stack",
            entry: entry(
                "#@ type kprobe\nstdw [%r10-8], 0x6425\nstdw [%r10-16], 7\nmov %r1, %r10\n\
                 add %r1, -8\nmov %r2, 8\nmov %r3, %r10\nadd %r3, -16\nmov %r4, 8\n\
                 call 177\nmov %r0, 0\nexit\n",
                false,
                None,
            ),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            name: "strncmp with a constant string",
            entry: frozen(&strncmp("ldmapval %r3, s, 0"), b"abc"),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            // Only bpf_snprintf's format is parsed.
            name: "strncmp with a string that is no valid format",
            entry: frozen(&strncmp("ldmapval %r3, s, 0"), b"%y"),
            ours: Ok(()),
            kernel: Ok(()),
        },
        Case {
            name: "strncmp with a map not frozen",
            entry: entry(&strncmp("ldmapval %r3, s, 0"), false, Some(value(b"abc"))),
            ours: readonly,
            kernel: k_readonly,
        },
        Case {
            name: "strncmp with a stack string",
            entry: frozen(&strncmp("mov %r3, %r10\nadd %r3, -8"), b"abc"),
            ours: Err(K::HelperArgType {
                reg: 3,
                found: "fp",
                expected: "map_value",
            }),
            kernel: Err((libc::EACCES, "R3 type=fp expected=map_value")),
        },
        Case {
            name: "strncmp with no NUL",
            entry: entry(
                &strncmp("ldmapval %r3, s, 0"),
                true,
                Some(Arc::from(&b"0123456789abcdef0123456789abcdef"[..])),
            ),
            ours: Err(K::StringNotTerminated),
            kernel: Err((libc::EINVAL, "string is not zero-terminated")),
        },
    ]
}

fn ours(e: &Entry) -> Result<Verified, Rejection> {
    let maps = |imm: i32| e.map(imm);
    let info = ProgramInfo {
        insns: &e.insns,
        prog_type: e.prog_type,
        gpu: false,
        maps: &maps,
        mem_len: 0,
    };
    verify(&info, &Options::default())
}

#[test]
fn our_verifier_checks_constant_strings_at_load() {
    let mut wrong = Vec::new();
    for c in cases() {
        let got = ours(&c.entry).map(|_| ()).map_err(|r| r.kind);
        if got != c.ours {
            wrong.push(format!("{}: want {:?}, got {got:?}", c.name, c.ours));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn rejections_read_as_the_kernels() {
    let text = |kind: RejectKind| kind.to_string();
    assert_eq!(
        text(RejectKind::NotReadonlyMap { reg: 3 }),
        "R3 does not point to a readonly map'"
    );
    assert_eq!(
        text(RejectKind::NotConstantAddress { reg: 3 }),
        "R3 is not a constant address'"
    );
    assert_eq!(
        text(RejectKind::InvalidFormat {
            error: FormatError::BadConversion(1)
        }),
        "Invalid format string: unsupported conversion at byte 1"
    );
    let e = ours(&frozen(&snprintf(&rodata(), "", FMT, TWO_ARGS), b"%d%d%d")).unwrap_err();
    assert!(
        e.log().ends_with(
            "call bpf_snprintf#165\nInvalid format string: the conversion at byte 4 has no argument\n"
        ),
        "{}",
        e.log()
    );
}

/// The kernel's answers pinned above are 6.18's; another kernel gets its own row.
fn kernel_answers_pinned() -> bool {
    *for_running(&[Row {
        from: Version(6, 18),
        until: None,
        value: true,
    }])
}

#[test]
fn the_kernel_agrees_on_every_case() {
    if let Some(why) = kernel::unavailable() {
        eprintln!("skipping the kernel comparison: {why}");
        return;
    }
    let pinned = kernel_answers_pinned();
    let mut wrong = Vec::new();
    for c in cases() {
        // Creating and loading asserts every fd is a kernel object.
        let maps = kernel::create_maps(&c.entry).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let k = maps
            .load(&c.entry)
            .map(|_| ())
            .map_err(|r| (r.errno, r.last_line().to_string()));
        let o = ours(&c.entry);
        let ours_errno = o.as_ref().err().map(|r| r.kind.errno());
        if k.is_ok() != o.is_ok() || k.as_ref().err().map(|e| e.0) != ours_errno {
            wrong.push(format!(
                "{}: kernel {k:?}, ours {:?}",
                c.name,
                o.map(|_| ())
                    .map_err(|r| (r.kind.errno(), r.kind.to_string()))
            ));
        }
        let want = c.kernel.map_err(|(errno, line)| (errno, line.to_string()));
        if pinned && k != want {
            wrong.push(format!("{}: kernel {k:?}, pinned {want:?}", c.name));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Formats and whether the kernel takes each with two arguments (bytes from 0x80 are
/// the kernel's Latin-1 classes: 0xa0 is white space, 0xa1 and 0xd7 punctuation, 0xc0 a
/// letter).
const FORMATS: &[(&[u8], bool)] = &[
    (b"%d %i %u %x %X", false),
    (b"%d %i", true),
    (b"%ld %lli", true),
    (b"%lx%llX", true),
    (b"%llld", false),
    (b"%hd", false),
    (b"%zd", false),
    (b"%5.2d", false),
    (b"%.d", false),
    (b"%-08d%+ d", true),
    (b"%00-+ 12d", true),
    (b"%5-d", false),
    (b"%y", false),
    (b"%", false),
    (b"tail %", false),
    (b"%%%%", true),
    (b"%c%s", true),
    (b"%lc", false),
    (b"%ls", false),
    (b"%05s", true),
    (b"%sx", false),
    (b"%s5", false),
    (b"%s_", true),
    (b"%s\xa1", true),
    (b"%s\xc0", false),
    (b"%s\x80", false),
    (b"%cx%dx", true),
    (b"%p", true),
    (b"%p,%d", true),
    (b"%pz", false),
    (b"%pa", false),
    (b"%p5", false),
    (b"%p_", true),
    (b"%p\t", true),
    (b"%p\xa0", true),
    (b"%p\xa1", true),
    (b"%p\xbf", true),
    (b"%p\xd7", true),
    (b"%p\xf7", true),
    (b"%p\xc0", false),
    (b"%p\xdf", false),
    (b"%p\x80", false),
    (b"%p\x7f", false),
    (b"%pK%px", true),
    (b"%pKz%pxx", true),
    (b"%ps%pS", true),
    (b"%psq%pSx", true),
    (b"%pB%pB5", true),
    (b"%pks%pus", true),
    (b"%pks,%pus ", true),
    (b"%pks5", false),
    (b"%pusx", false),
    (b"%pks\xc0", false),
    (b"%pk", false),
    (b"%pu", false),
    (b"%pI4 %pi6", true),
    (b"%pi4x%pI6c", true),
    (b"%pI5", false),
    (b"%pI", false),
    (b"%-4pI4", true),
    (b"%10p", true),
    (b"\t\n\x0b\x0c\r", true),
    (b"\x07", false),
    (b"\x1f", false),
    (b"\x7f", false),
    (b"\x80\x9f\xa0\xff", true),
];

#[test]
fn formats_are_judged_as_the_kernel_judges_them() {
    let kernel_there = match kernel::unavailable() {
        None => true,
        Some(why) => {
            eprintln!("the kernel is not asked: {why}");
            false
        }
    };
    let mut wrong = Vec::new();
    for &(fmt, accepted) in FORMATS {
        assert!(fmt.len() < 32, "{fmt:?} does not fit the map value");
        let e = frozen(&snprintf(&rodata(), "", FMT, TWO_ARGS), fmt);
        let shown = String::from_utf8_lossy(fmt);
        let o = ours(&e);
        if o.is_ok() != accepted {
            wrong.push(format!(
                "{shown:?}: want accepted={accepted}, ours {:?}",
                o.map(|_| ()).map_err(|r| r.kind)
            ));
        }
        if kernel_there {
            let maps = kernel::create_maps(&e).unwrap_or_else(|err| panic!("{err}"));
            let k = maps.load(&e);
            if k.is_ok() != accepted {
                wrong.push(format!(
                    "{shown:?}: want accepted={accepted}, kernel {:?}",
                    k.map(|_| ()).map_err(|r| r.last_line().to_string())
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
