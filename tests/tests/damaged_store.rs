//! A damaged store never takes a target down. A target under `bpftime run` calls a
//! probed function at full speed from four threads and checks every result it gets;
//! meanwhile the file of one store object (a map of each type, the program, the link,
//! the CPU slot table, the store header) is truncated, zeroed and overwritten with
//! random bytes, three rounds of each. The target must exit 0 with its own results
//! right, nothing may die of a signal, the agent must say once that the object is
//! damaged, and the program standing on it must be detached (its counter, in a map
//! nobody damages, stops).

use bpftime_runtime::{Map, ObjectKind, Store};
use bpftime_tests::Session;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TARGET: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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
	printf("target: %s\n", bad ? "WRONG RESULTS" : "results right");
	return bad ? 3 : 0;
}
"#;

/// The program: counts its runs in `hits` (never damaged) and works `target`.
fn program(map: &str, body: &str) -> String {
    format!(
        "#include <linux/bpf.h>\n#include <bpf/bpf_helpers.h>\n\
         struct {{ __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 1);\n\
                  __type(key, __u32); __type(value, __u64); }} hits SEC(\".maps\");\n\
         {map}\n\
         SEC(\"uprobe/work\") int on_work(__u64 *ctx) {{\n\
             __u32 zero = 0; __u64 x = ctx[14];\n\
             __u64 *h = bpf_map_lookup_elem(&hits, &zero);\n\
             if (h) __sync_fetch_and_add(h, 1);\n\
             {body}\n\
             return 0;\n\
         }}\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n"
    )
}

/// What is damaged: a map named `target` of a type, or another store file.
#[derive(Clone, Copy, Debug)]
enum Object {
    Map(&'static str),
    Program,
    Link,
    CpuSlots,
    StoreHeader,
}

/// Every map type a program here uses, with its declaration and use. Ring buffers and
/// perf event arrays have their consumer in the tool as well: `damaged_rings.rs` damages
/// them under both.
const MAPS: &[(&str, &str, &str)] = &[
    (
        "array",
        "struct { __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, __u64); } target SEC(\".maps\");",
        "__u32 k = x & 63; __u64 *v = bpf_map_lookup_elem(&target, &k); if (v) *v += 1;",
    ),
    (
        "percpu_array",
        "struct { __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, 64); __type(key, __u32); __type(value, __u64); } target SEC(\".maps\");",
        "__u32 k = x & 63; __u64 *v = bpf_map_lookup_elem(&target, &k); if (v) *v += 1;",
    ),
    (
        "hash",
        "struct { __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, 64); __type(key, __u64); __type(value, __u64); } target SEC(\".maps\");",
        "__u64 k = x & 127; bpf_map_update_elem(&target, &k, &x, BPF_ANY); __u64 *v = bpf_map_lookup_elem(&target, &k); if (v && (x & 1)) bpf_map_delete_elem(&target, &k);",
    ),
    (
        "percpu_hash",
        "struct { __uint(type, BPF_MAP_TYPE_PERCPU_HASH); __uint(max_entries, 64); __type(key, __u64); __type(value, __u64); } target SEC(\".maps\");",
        "__u64 k = x & 127; bpf_map_update_elem(&target, &k, &x, BPF_ANY); if (x & 1) bpf_map_delete_elem(&target, &k);",
    ),
    (
        "lru_hash",
        "struct { __uint(type, BPF_MAP_TYPE_LRU_HASH); __uint(max_entries, 64); __type(key, __u64); __type(value, __u64); } target SEC(\".maps\");",
        "__u64 k = x & 255; bpf_map_update_elem(&target, &k, &x, BPF_ANY); bpf_map_lookup_elem(&target, &k);",
    ),
    (
        "lpm_trie",
        "struct key { __u32 prefixlen; __u8 data[4]; };\n struct { __uint(type, BPF_MAP_TYPE_LPM_TRIE); __uint(max_entries, 64); __uint(map_flags, BPF_F_NO_PREALLOC); __type(key, struct key); __type(value, __u64); } target SEC(\".maps\");",
        "struct key k = { 24, { x & 255, 1, 2, 3 } }; bpf_map_update_elem(&target, &k, &x, BPF_ANY); k.prefixlen = 32; bpf_map_lookup_elem(&target, &k);",
    ),
    (
        "queue",
        "struct { __uint(type, BPF_MAP_TYPE_QUEUE); __uint(max_entries, 64); __type(value, __u64); } target SEC(\".maps\");",
        "bpf_map_push_elem(&target, &x, BPF_EXIST); if (x & 1) bpf_map_pop_elem(&target, &x);",
    ),
    (
        "stack",
        "struct { __uint(type, BPF_MAP_TYPE_STACK); __uint(max_entries, 64); __type(value, __u64); } target SEC(\".maps\");",
        "bpf_map_push_elem(&target, &x, BPF_EXIST); if (x & 1) bpf_map_pop_elem(&target, &x);",
    ),
    (
        "bloom_filter",
        "struct { __uint(type, BPF_MAP_TYPE_BLOOM_FILTER); __uint(max_entries, 1000); __type(value, __u64); } target SEC(\".maps\");",
        "bpf_map_push_elem(&target, &x, BPF_ANY); bpf_map_peek_elem(&target, &x);",
    ),
    (
        "stack_trace",
        "struct { __uint(type, BPF_MAP_TYPE_STACK_TRACE); __uint(max_entries, 64); __uint(key_size, 4); __uint(value_size, 8 * 8); } target SEC(\".maps\");",
        "bpf_get_stackid(ctx, &target, BPF_F_USER_STACK);",
    ),
];

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
}

/// The map named `name` in the store.
fn map_named(store: &Store, name: &str) -> Option<Map> {
    store
        .ids(ObjectKind::Map)
        .into_iter()
        .filter_map(|id| Map::open(store, id).ok())
        .find(|m| m.name() == name)
}

fn hits(m: &Map) -> u64 {
    let mut v = [0u8; 8];
    m.lookup(&0u32.to_ne_bytes(), &mut v)
        .map_or(0, |_| u64::from_ne_bytes(v))
}

/// Runs one case: damages `object` first in `first` way, then every way, in rounds.
fn case(tag: &str, bpf: &str, object: Object, first: Way) {
    let s = Session::new(tag);
    let obj = s.compile_bpf("damage", bpf);
    let src = s.tmp.join("target.c");
    std::fs::write(&src, TARGET).unwrap();
    let target = s.tmp.join("target");
    let cc = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&target)
        .arg(&src)
        .output()
        .expect("run gcc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let stop = s.tmp.join("stop");
    let (out_path, err_path) = (s.tmp.join("stdout"), s.tmp.join("stderr"));
    let mut child = s
        .bpftime()
        .args(["run", obj.to_str().unwrap(), "--"])
        .arg(&target)
        .arg(&stop)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn bpftime run");
    let context = || {
        format!(
            "stdout:\n{}\nstderr:\n{}",
            std::fs::read_to_string(&out_path).unwrap_or_default(),
            std::fs::read_to_string(&err_path).unwrap_or_default()
        )
    };
    // The program runs once `hits` moves.
    let end = Instant::now() + Duration::from_secs(60);
    let (store, counter) = loop {
        assert!(Instant::now() < end, "the program never ran: {}", context());
        if let Ok(store) = Store::open(&s.store) {
            if let Some(m) = map_named(&store, "hits") {
                if hits(&m) > 0 {
                    break (store, m);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (path, name) = match object {
        Object::Map(kind) => {
            let m = map_named(&store, "target").unwrap_or_else(|| panic!("{kind} map `target`"));
            (m.path().to_path_buf(), format!("map {} (", m.id()))
        }
        Object::Program => {
            let id = store.ids(ObjectKind::Program)[0];
            (
                store.path(ObjectKind::Program, id),
                format!("program {id} ("),
            )
        }
        Object::Link => {
            let id = store.ids(ObjectKind::Link)[0];
            (store.path(ObjectKind::Link, id), format!("link {id} ("))
        }
        Object::CpuSlots => (store.dir().join("cpus"), "the CPU slot table".to_string()),
        Object::StoreHeader => (store.dir().join("store"), "the store header".to_string()),
    };
    let len = std::fs::metadata(&path).unwrap().len();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ len;
    // Three rounds of the three ways, 150 ms apart: 1.35 s in all, while the target's four
    // threads make millions of probed calls. The agent's watcher looks twice a second, so
    // the object is seen damaged in each state (truncated, zeroed, random) at least once
    // per round, and programs run over the damage between its looks, which is what
    // must not crash.
    let order = match first {
        Way::Truncate => [Way::Truncate, Way::Zero, Way::Random],
        Way::Zero => [Way::Zero, Way::Random, Way::Truncate],
        Way::Random => [Way::Random, Way::Truncate, Way::Zero],
    };
    for _round in 0..3 {
        for way in order {
            way.apply(&path, len, &mut seed);
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    // Detached: the counter stops (after the watcher's next look, within 500 ms).
    let detaches = !matches!(object, Object::StoreHeader);
    if detaches {
        std::thread::sleep(Duration::from_millis(1000));
        let before = hits(&counter);
        std::thread::sleep(Duration::from_millis(700));
        let after = hits(&counter);
        assert_eq!(
            before,
            after,
            "{object:?}: the program still runs on a damaged object\n{}",
            context()
        );
    }
    std::fs::write(&stop, b"").unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("{object:?}: the target hangs\n{}", context());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        stdout.contains("target: results right"),
        "{object:?}: the target's results\n{}",
        context()
    );
    assert_eq!(status.code(), Some(0), "{object:?}\n{}", context());
    for deadly in ["SIGSEGV", "SIGBUS", "signal 11", "signal 7", "panicked"] {
        assert!(
            !stderr.contains(deadly),
            "{object:?}: {deadly}\n{}",
            context()
        );
    }
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" is damaged: "))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "{object:?}: one warning for the damaged object\n{}",
        context()
    );
    assert!(
        warnings[0].contains(&name) && warnings[0].contains("WARN"),
        "{object:?}: the warning names {name}\n{}",
        context()
    );
}

fn all_cases(first: Way) {
    let tag = format!("{first:?}").to_lowercase();
    for (name, decl, body) in MAPS {
        case(
            &format!("dmg-{tag}-{name}"),
            &program(decl, body),
            Object::Map(name),
            first,
        );
    }
    let (_, decl, body) = MAPS[1];
    for object in [
        Object::Program,
        Object::Link,
        Object::CpuSlots,
        Object::StoreHeader,
    ] {
        case(
            &format!("dmg-{tag}-{object:?}").to_lowercase(),
            &program(decl, body),
            object,
            first,
        );
    }
}

#[test]
fn targets_survive_store_files_truncated_first() {
    all_cases(Way::Truncate);
}

#[test]
fn targets_survive_store_files_zeroed_first() {
    all_cases(Way::Zero);
}

#[test]
fn targets_survive_store_files_overwritten_first() {
    all_cases(Way::Random);
}
