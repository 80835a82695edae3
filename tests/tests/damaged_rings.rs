//! A damaged ring never takes its consumer down. A target calls a probed function at full
//! speed from four threads, each call an event into a ring buffer map or a perf buffer;
//! the tool reading the ring (a libbpf C loader under `bpftime load`, or `bpftime run`
//! itself) maps the ring's store file through the syscall shim. Meanwhile that file is
//! truncated, zeroed and overwritten with random bytes, three rounds of each. The tool
//! must not die of a signal and must say once that the ring is damaged; the target must
//! exit 0 with its own results right.

use bpftime_runtime::{Map, ObjectKind, Store};
use bpftime_tests::Session;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Calls work() on four threads until the stop file exists; writes whether its results
/// are right to the result file (its stdout may be a tool's, full of events).
const TARGET: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline, used)) long work(long x)
{
	volatile long s[4];
	long r = 0;
	for (int i = 0; i < 4; i++) {
		s[i] = x * i;
		r += s[i];
	}
	return r;
}

static const char *stop;
static long results[4][2];

static void *loop(void *arg)
{
	long *out = arg, sum = 0, n = 0;
	for (;;) {
		for (int i = 0; i < 1000; i++, n++)
			sum += work(n);
		if (access(stop, F_OK) == 0 || n > 4000000000L)
			break;
	}
	out[0] = sum;
	out[1] = n;
	return 0;
}

int main(int argc, char **argv)
{
	pthread_t t[4];
	int bad = 0;
	stop = argv[1];
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], 0, loop, results[i]);
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], 0);
		long n = results[i][1];
		/* work(x) = 6x, so the sum of work(0..n-1) is 3n(n-1). */
		if (results[i][0] != 3 * n * (n - 1))
			bad = 1;
	}
	FILE *f = fopen(argv[2], "w");
	if (f) {
		fprintf(f, "target: %s\n", bad ? "WRONG RESULTS" : "results right");
		fclose(f);
	}
	return bad ? 3 : 0;
}
"#;

/// A libbpf tool that attaches every program of an object to work() in a target and
/// counts the events of its map `events` (a ring buffer or a perf buffer), polling as
/// tools do; it frees the buffer (unmapping the rings) before it prints the count.
const TOOL: &str = r#"
#include <bpf/libbpf.h>
#include <linux/bpf.h>
#include <signal.h>
#include <stdio.h>

static volatile sig_atomic_t stop;
static unsigned long long events;

static void on_signal(int sig) { stop = 1; }
static int on_record(void *ctx, void *data, size_t len) { events++; return 0; }
static void on_sample(void *ctx, int cpu, void *data, __u32 size) { events++; }
static void on_lost(void *ctx, int cpu, __u64 n) {}

int main(int argc, char **argv)
{
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	struct bpf_program *prog;
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "tool: cannot load %s\n", argv[1]);
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		LIBBPF_OPTS(bpf_uprobe_opts, o, .func_name = "work");
		if (!bpf_program__attach_uprobe_opts(prog, -1, argv[2], 0, &o)) {
			fprintf(stderr, "tool: cannot attach\n");
			return 1;
		}
	}
	struct bpf_map *map = bpf_object__find_map_by_name(obj, "events");
	struct ring_buffer *rb = 0;
	struct perf_buffer *pb = 0;
	if (bpf_map__type(map) == BPF_MAP_TYPE_RINGBUF)
		rb = ring_buffer__new(bpf_map__fd(map), on_record, 0, 0);
	else
		pb = perf_buffer__new(bpf_map__fd(map), 8, on_sample, on_lost, 0, 0);
	if (!rb && !pb) {
		fprintf(stderr, "tool: cannot map the buffer\n");
		return 1;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	printf("ready\n");
	fflush(stdout);
	while (!stop) {
		if (rb)
			ring_buffer__poll(rb, 50);
		else
			perf_buffer__poll(pb, 50);
	}
	ring_buffer__free(rb);
	perf_buffer__free(pb);
	printf("events=%llu\n", events);
	return 0;
}
"#;

#[derive(Clone, Copy, Debug)]
enum Ring {
    RingBuffer,
    PerfBuffer,
}

impl Ring {
    fn program(self) -> String {
        let (map, output) = match self {
            Ring::RingBuffer => (
                "struct { __uint(type, BPF_MAP_TYPE_RINGBUF); __uint(max_entries, 64 * 1024); } events SEC(\".maps\");",
                "bpf_ringbuf_output(&events, &x, sizeof(x), 0);",
            ),
            Ring::PerfBuffer => (
                "struct { __uint(type, BPF_MAP_TYPE_PERF_EVENT_ARRAY); __uint(key_size, 4); __uint(value_size, 4); } events SEC(\".maps\");",
                "bpf_perf_event_output(ctx, &events, BPF_F_CURRENT_CPU, &x, sizeof(x));",
            ),
        };
        format!(
            "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n{map}\n\
             SEC(\"uprobe/work\") int on_work(__u64 *ctx) {{\n\
                 __u64 x = ctx[14];\n\
                 {output}\n\
                 return 0;\n\
             }}\n\
             char LICENSE[] SEC(\"license\") = \"GPL\";\n"
        )
    }

    /// The store file of the ring the tool reads (of perf rings, one per CPU, the first).
    fn file(self, store: &Store) -> Option<PathBuf> {
        match self {
            Ring::RingBuffer => store
                .ids(ObjectKind::Map)
                .into_iter()
                .filter_map(|id| Map::open(store, id).ok())
                .find(|m| m.name() == "events")
                .map(|m| m.path().to_path_buf()),
            Ring::PerfBuffer => {
                let mut rings: Vec<PathBuf> = std::fs::read_dir(store.dir())
                    .ok()?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("perfring-"))
                    })
                    .collect();
                rings.sort();
                rings.into_iter().next()
            }
        }
    }
}

/// The three ways a file is damaged.
#[derive(Clone, Copy, Debug)]
enum Way {
    Truncate,
    Zero,
    Random,
}

impl Way {
    fn apply(self, path: &Path, len: u64, seed: &mut u64) {
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(path) else {
            return;
        };
        match self {
            Way::Truncate => {
                let _ = f.set_len(0);
            }
            Way::Zero | Way::Random => {
                let mut bytes = vec![0u8; len as usize];
                if let Way::Random = self {
                    for b in &mut bytes {
                        // xorshift: a different garbage every time, no crate needed.
                        *seed ^= *seed << 13;
                        *seed ^= *seed >> 7;
                        *seed ^= *seed << 17;
                        *b = *seed as u8;
                    }
                }
                use std::os::unix::fs::FileExt;
                let _ = f.write_all_at(&bytes, 0);
            }
        }
    }

    fn order(self) -> [Way; 3] {
        match self {
            Way::Truncate => [Way::Truncate, Way::Zero, Way::Random],
            Way::Zero => [Way::Zero, Way::Random, Way::Truncate],
            Way::Random => [Way::Random, Way::Truncate, Way::Zero],
        }
    }
}

/// What the tool's warning about a ring it maps says.
const TOOL_WARNING: &str = "as this tool maps it, is damaged: ";

fn compile(s: &Session, what: &str, source: &str, libs: &[&str]) -> PathBuf {
    let src = s.tmp.join(format!("{what}.c"));
    std::fs::write(&src, source).unwrap();
    let out = s.tmp.join(what);
    let cc = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .args(libs)
        .output()
        .expect("run gcc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    out
}

fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("{what} hangs");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Damages the ring's file in rounds, `first` way first, once events flow.
fn damage(s: &Session, ring: Ring, first: Way) {
    s.wait_for_links(1);
    let end = Instant::now() + Duration::from_secs(30);
    let path = loop {
        if let Some(p) = Store::open(&s.store).ok().and_then(|st| ring.file(&st)) {
            break p;
        }
        assert!(Instant::now() < end, "{ring:?}: no ring file in the store");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Events flow by now: the target runs from the start under the probe.
    std::thread::sleep(Duration::from_millis(700));
    let len = std::fs::metadata(&path).unwrap().len();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ len;
    for _round in 0..3 {
        for way in first.order() {
            way.apply(&path, len, &mut seed);
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    // The tool checks its rings at each poll (50 ms).
    std::thread::sleep(Duration::from_millis(500));
}

fn check_stderr(what: &str, stderr: &str) {
    for deadly in ["SIGSEGV", "SIGBUS", "signal 11", "signal 7", "panicked"] {
        assert!(!stderr.contains(deadly), "{what}: {deadly}\n{stderr}");
    }
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(TOOL_WARNING))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "{what}: one warning from the tool for its damaged ring\n{stderr}"
    );
    assert!(
        warnings[0].contains("bpftime list --clean"),
        "{what}: the warning says what to do\n{stderr}"
    );
}

fn check_target(what: &str, result: &Path, status: std::process::ExitStatus, context: &str) {
    let verdict = std::fs::read_to_string(result).unwrap_or_default();
    assert!(
        verdict.contains("target: results right"),
        "{what}: the target's results: {verdict:?}\n{context}"
    );
    assert_eq!(status.code(), Some(0), "{what}: the target\n{context}");
}

/// A libbpf tool under `bpftime load` reads the ring; the target runs under `bpftime start`.
fn under_load(ring: Ring, first: Way) {
    let what = format!("bpftime load, {ring:?}, {first:?} first");
    let s = Session::new(&format!("dmgring-load-{ring:?}-{first:?}").to_lowercase());
    let obj = s.compile_bpf("ring", &ring.program());
    let target = compile(&s, "target", TARGET, &[]);
    let tool = compile(&s, "tool", TOOL, &["-lbpf"]);
    let (stop, result) = (s.tmp.join("stop"), s.tmp.join("result"));
    let tool = s.load(&[
        tool.to_str().unwrap(),
        obj.to_str().unwrap(),
        target.to_str().unwrap(),
    ]);
    let target_err = s.tmp.join("target.stderr");
    let mut app = s
        .bpftime()
        .arg("start")
        .arg(&target)
        .arg(&stop)
        .arg(&result)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&target_err).unwrap())
        .spawn()
        .expect("spawn bpftime start");
    damage(&s, ring, first);
    std::fs::write(&stop, b"").unwrap();
    let status = wait_exit(&mut app, &what);
    let (code, lines, stderr) = tool.stop();
    let context = format!(
        "tool stdout: {lines:?}\ntool stderr:\n{stderr}\ntarget stderr:\n{}",
        std::fs::read_to_string(&target_err).unwrap_or_default()
    );
    check_target(&what, &result, status, &context);
    assert_eq!(code, 0, "{what}: the tool's exit\n{context}");
    assert!(
        lines.iter().any(|l| l.starts_with("events=")),
        "{what}: the tool's count\n{context}"
    );
    check_stderr(&what, &stderr);
}

/// `bpftime run` reads the ring itself.
fn under_run(ring: Ring, first: Way) {
    let what = format!("bpftime run, {ring:?}, {first:?} first");
    let s = Session::new(&format!("dmgring-run-{ring:?}-{first:?}").to_lowercase());
    let obj = s.compile_bpf("ring", &ring.program());
    let target = compile(&s, "target", TARGET, &[]);
    let (stop, result) = (s.tmp.join("stop"), s.tmp.join("result"));
    let err_path = s.tmp.join("stderr");
    // Its stdout is every event: nothing the test reads.
    let mut child = s
        .bpftime()
        .args(["run", obj.to_str().unwrap(), "--"])
        .arg(&target)
        .arg(&stop)
        .arg(&result)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn bpftime run");
    damage(&s, ring, first);
    std::fs::write(&stop, b"").unwrap();
    let status = wait_exit(&mut child, &what);
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let context = format!("bpftime run: {status}\n{stderr}");
    check_target(&what, &result, status, &context);
    check_stderr(&what, &stderr);
}

#[test]
fn a_loader_survives_its_ring_buffer_file_damaged() {
    for first in [Way::Truncate, Way::Zero, Way::Random] {
        under_load(Ring::RingBuffer, first);
    }
}

#[test]
fn a_loader_survives_its_perf_buffer_file_damaged() {
    for first in [Way::Truncate, Way::Zero, Way::Random] {
        under_load(Ring::PerfBuffer, first);
    }
}

#[test]
fn bpftime_run_survives_its_ring_buffer_file_damaged() {
    for first in [Way::Truncate, Way::Zero, Way::Random] {
        under_run(Ring::RingBuffer, first);
    }
}

#[test]
fn bpftime_run_survives_its_perf_buffer_file_damaged() {
    for first in [Way::Truncate, Way::Zero, Way::Random] {
        under_run(Ring::PerfBuffer, first);
    }
}
