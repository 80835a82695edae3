//! `bpf_loop` and `bpf_snprintf` in a clang-compiled uprobe under `bpftime run`, on the
//! JIT and on the interpreter, against the kernel running the same code: the object's
//! socket filters, run once each with `BPF_PROG_TEST_RUN` (`bpftool prog run`), return
//! what the uprobe stores in its globals.

use bpftime_tests::{examples, Session};
use std::fs::File;
use std::process::{Command, Stdio};

/// Calls of the probed function.
const N: u64 = 100;

/// The computations, each once as a socket filter returning its result (for the
/// kernel) and all of them in a uprobe storing the results in globals (for bpftime).
const SOURCE: &str = r#"
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct loop_ctx { __u64 sum; __u64 stop_at; };

/* bpf_loop's callback: sums the indices, stops after `stop_at`. */
static long step(__u64 index, void *data)
{
	struct loop_ctx *c = data;
	c->sum += index;
	return index == c->stop_at;
}

static const char fmt[] = "%d|%5u|%-4x|%08lx|%lld|%c|%s|%%|%X|% i|%-3c|%6s|%s";
char text[96];

static __always_inline long format_into(char *out, __u32 size)
{
	char word[4] = "str";
	/* The %s of slot 6 is NULL: printed as nothing, as in the kernel. */
	__u64 data[12] = { -42, 7, 255, 0xdeadbeef, -1234567890123LL, 'Z', 0,
			   0xabc, 6, 'q', (__u64)word, (__u64)word };
	return bpf_snprintf(out, size, fmt, data, sizeof(data));
}

static __always_inline __u32 text_hash(void)
{
	__u32 h = 2166136261u;
	for (int i = 0; i < sizeof(text); i++) {
		h ^= (__u8)text[i];
		h *= 16777619u;
	}
	return h;
}

static __always_inline __u32 loop_count(void) { struct loop_ctx c = { 0, 4 }; return bpf_loop(10, step, &c, 0); }
static __always_inline __u32 loop_sum(void) { struct loop_ctx c = { 0, 4 }; bpf_loop(10, step, &c, 0); return c.sum; }
static __always_inline __u32 loop_all(void) { struct loop_ctx c = { 0, 100 }; return bpf_loop(10, step, &c, 0) * 1000 + c.sum; }
static __always_inline __u32 loop_none(void) { struct loop_ctx c = { 7, 4 }; return bpf_loop(0, step, &c, 0) * 1000 + c.sum; }
static __always_inline __u32 loop_flags(void) { struct loop_ctx c = { 0, 4 }; return bpf_loop(10, step, &c, 1); }
static __always_inline __u32 loop_too_many(void) { struct loop_ctx c = { 0, 4 }; return bpf_loop((1 << 23) + 1, step, &c, 0); }
static __always_inline __u32 snprintf_len(void) { return format_into(text, sizeof(text)); }
static __always_inline __u32 snprintf_hash(void) { format_into(text, sizeof(text)); return text_hash(); }
static __always_inline __u32 snprintf_short(void) { char s[6]; long n = format_into(s, sizeof(s)); return n * 1000 + s[4] * 10 + (s[5] == 0); }

#ifdef KERNEL
#define ONE(name) SEC("socket") int k_##name(void *ctx) { return name(); }
ONE(loop_count) ONE(loop_sum) ONE(loop_all) ONE(loop_none) ONE(loop_flags) ONE(loop_too_many)
ONE(snprintf_len) ONE(snprintf_hash) ONE(snprintf_short)
#else
__u32 r_loop_count, r_loop_sum, r_loop_all, r_loop_none, r_loop_flags, r_loop_too_many;
__u32 r_snprintf_len, r_snprintf_hash, r_snprintf_short;
__u64 calls;

SEC("uprobe/work")
int on_work(void *ctx)
{
	r_loop_count = loop_count();
	r_loop_sum = loop_sum();
	r_loop_all = loop_all();
	r_loop_none = loop_none();
	r_loop_flags = loop_flags();
	r_loop_too_many = loop_too_many();
	r_snprintf_short = snprintf_short();
	r_snprintf_hash = snprintf_hash();
	r_snprintf_len = snprintf_len();
	__sync_fetch_and_add(&calls, 1);
	return 0;
}
#endif

char LICENSE[] SEC("license") = "GPL";
"#;

const RESULTS: [&str; 9] = [
    "loop_count",
    "loop_sum",
    "loop_all",
    "loop_none",
    "loop_flags",
    "loop_too_many",
    "snprintf_len",
    "snprintf_hash",
    "snprintf_short",
];

/// What the kernel's semantics give, worked out by hand: the kernel is asked too when
/// it can answer, and must agree.
fn expected() -> Vec<(&'static str, u64)> {
    let text = "-42|    7|ff  |deadbeef|-1234567890123|Z||%|ABC| 6|q  |   str|str";
    let mut hash = 2166136261u32;
    for i in 0..96 {
        hash ^= u32::from(text.as_bytes().get(i).copied().unwrap_or(0));
        hash = hash.wrapping_mul(16777619);
    }
    let len = text.len() as u64 + 1;
    vec![
        ("loop_count", 5),
        ("loop_sum", 1 + 2 + 3 + 4),
        ("loop_all", 10 * 1000 + 45),
        ("loop_none", 7),
        ("loop_flags", (-22i32) as u32 as u64),
        ("loop_too_many", (-7i32) as u32 as u64),
        ("snprintf_len", len),
        ("snprintf_hash", u64::from(hash)),
        // "-42| " and its NUL.
        ("snprintf_short", len * 1000 + u64::from(b' ') * 10 + 1),
    ]
}

/// Compiles `SOURCE` with `define`d macros; None (after saying why) without clang.
fn compile(s: &Session, name: &str, defines: &[&str]) -> Option<std::path::PathBuf> {
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang-19".into());
    let src = s.tmp.join(format!("{name}.bpf.c"));
    let obj = s.tmp.join(format!("{name}.bpf.o"));
    std::fs::write(&src, SOURCE).unwrap();
    let multiarch = Command::new("gcc")
        .arg("-print-multiarch")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let out = match Command::new(&clang)
        .args(["-g", "-O2", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-c")
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: cannot run {clang}: {e}");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "{clang} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(obj)
}

/// Each socket filter's return value on the kernel, or None (after saying why) where
/// the kernel cannot be asked.
fn kernel_results(s: &Session) -> Option<Vec<(&'static str, u64)>> {
    if let Some(why) = bpftime_tests::kernel_bpffs_unavailable() {
        eprintln!("kernel comparison skipped: {why}");
        return None;
    }
    let obj = compile(s, "oracle", &["KERNEL"])?;
    let pins = std::path::Path::new("/sys/fs/bpf").join(format!("bpftime-{}", s.store));
    let load = match Command::new("bpftool")
        .args(["prog", "loadall"])
        .arg(&obj)
        .arg(&pins)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("kernel comparison skipped: cannot run bpftool: {e}");
            return None;
        }
    };
    assert!(
        load.status.success(),
        "the kernel refuses the programs: {}",
        String::from_utf8_lossy(&load.stderr)
    );
    // A socket filter's test run needs at least an Ethernet header of input.
    let input = s.tmp.join("packet");
    std::fs::write(&input, [0u8; 64]).unwrap();
    let mut results = Vec::new();
    for name in RESULTS {
        let out = Command::new("bpftool")
            .args(["prog", "run", "pinned"])
            .arg(pins.join(format!("k_{name}")))
            .arg("data_in")
            .arg(&input)
            .args(["repeat", "1"])
            .output()
            .expect("bpftool ran once already");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let value = text
            .split("Return value: ")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("k_{name}: no return value in: {text}"));
        results.push((name, value));
    }
    let _ = std::fs::remove_dir_all(&pins);
    Some(results)
}

/// `bpftime run OBJECT -- calls N` with `BPFTIME_JIT=engine`; returns the printed
/// globals as (name, value) lines, after checking the run went well.
fn bpftime_results(s: &Session, obj: &str, engine: &str) -> Vec<(String, String)> {
    let calls = s.target_copy(examples::CALLS);
    let (out_path, err_path) = (
        s.tmp.join(format!("stdout-{engine}")),
        s.tmp.join(format!("stderr-{engine}")),
    );
    let status = s
        .bpftime()
        .args(["run", obj, "--"])
        .arg(&calls)
        .arg(N.to_string())
        .env("BPFTIME_JIT", engine)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .status()
        .expect("run bpftime");
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "BPFTIME_JIT={engine}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
        .lines()
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

#[test]
fn bpf_loop_and_bpf_snprintf_give_the_kernels_answers_on_both_engines() {
    let s = Session::new("loop-snprintf");
    let Some(obj) = compile(&s, "probe", &[]) else {
        return;
    };
    let want = expected();
    if let Some(kernel) = kernel_results(&s) {
        assert_eq!(kernel, want, "the kernel answers otherwise than expected");
    }
    for engine in ["1", "0"] {
        let got = bpftime_results(&s, obj.to_str().unwrap(), engine);
        let value = |k: &str| {
            got.iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("BPFTIME_JIT={engine}: no global {k} in {got:?}"))
        };
        assert_eq!(value("calls"), N.to_string(), "BPFTIME_JIT={engine}");
        for (name, v) in &want {
            assert_eq!(
                value(&format!("r_{name}")),
                v.to_string(),
                "BPFTIME_JIT={engine}: {name}"
            );
        }
    }
}
