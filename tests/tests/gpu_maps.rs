//! bpftime's GPU map types and its ring-buffer poll function, as a bpftime user's loader
//! meets them, without a GPU: the `gpu_maps` example loader (an unmodified libbpf 1.1 C
//! tool) runs under `bpftime load`, and what launches of vectorAdd would leave in its
//! maps is written into the store the way GPU attach's sync writes a launch's work (a
//! per-thread array's values at each thread's place, array and hash values, records
//! offered to the ring); the loader then reads them with `bpf()` and bpftime's poll
//! function (or libbpf's ring buffer), and says what it found. The same loader and
//! object run on a GPU in scripts/gpu-examples.sh.

use bpftime_runtime::{Map, RecordOffer, Store};
use bpftime_tests::{examples, field, run_with_timeout, Session, Tool};
use std::collections::HashMap;
use std::time::Duration;

/// The launch the store is made to hold: 4 blocks of 64 threads, three times, over a
/// vector of 256 elements, in maps made for 256 GPU threads.
const BLOCK: u32 = 64;
const THREADS: u32 = 256;
const ITERS: u64 = 3;

/// `map NAME id=ID` lines of the loader.
fn map_ids(lines: &[String]) -> HashMap<String, u32> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.strip_prefix("map ")?;
            let (name, id) = rest.split_once(" id=")?;
            Some((name.to_string(), id.parse().ok()?))
        })
        .collect()
}

/// A record as the exit probe writes it (`struct gpu_maps_event`).
fn event(global_id: u32, n: u32) -> Vec<u8> {
    let mut e = Vec::new();
    for w in [global_id, global_id / BLOCK, global_id % BLOCK, n] {
        e.extend(w.to_ne_bytes());
    }
    e.extend(0x6770_756d_6170_7321u64.to_ne_bytes());
    e
}

/// What ITERS launches leave in the maps, as the GPU sync lands it: each thread's own
/// values of the per-thread array, the totals, a count per block % 8, and a record per
/// thread and launch (two launches' records, then the rest after `between`), plus two
/// records of 8 bytes that the loader must see as such.
fn land_launches(store: &Store, ids: &HashMap<String, u32>, between: impl FnOnce()) {
    let open = |name: &str| Map::open(store, ids[name]).unwrap_or_else(|e| panic!("{name}: {e}"));
    let per_thread = open("per_thread");
    assert_eq!(per_thread.gpu_threads(), Some(THREADS));
    let v = per_thread.thread_values().unwrap();
    let (threads, stride) = v.per_cpu.unwrap();
    for t in 0..threads as usize {
        // SAFETY: keys 0 and 1 of thread t, 8-byte values inside the data area, which the
        // handle keeps mapped.
        unsafe {
            *(v.base.add(t * stride as usize) as *mut u64) = ITERS;
            *(v.base.add(v.key_stride as usize + t * stride as usize) as *mut u64) = t as u64 + 1;
        }
    }
    let launched = u64::from(THREADS) * ITERS;
    let totals = open("totals");
    for (slot, value) in [
        (0u32, launched),
        (1, launched * u64::from(THREADS)),
        (2, launched),
    ] {
        totals
            .update(&slot.to_ne_bytes(), &value.to_ne_bytes(), 0)
            .unwrap();
    }
    let by_block = open("by_block");
    for b in 0..THREADS / BLOCK {
        by_block
            .update(
                &b.to_ne_bytes(),
                &(u64::from(BLOCK) * ITERS).to_ne_bytes(),
                0,
            )
            .unwrap();
    }
    let events = open("events");
    let offer = |launch: u64| {
        for t in 0..THREADS {
            assert_eq!(
                events.offer_record(0, &event(t, THREADS)),
                RecordOffer::Taken,
                "launch {launch} thread {t}"
            );
        }
    };
    offer(0);
    offer(1);
    assert_eq!(events.offer_record(0, &[1u8; 8]), RecordOffer::Taken);
    between();
    for launch in 2..ITERS {
        offer(launch);
    }
    assert_eq!(events.offer_record(0, &[2u8; 8]), RecordOffer::Taken);
}

/// The loader under `bpftime load`, reading its ring with `reader` (`poll`: bpftime's
/// poll function; `ringbuf`: libbpf's ring buffer), after the store got what ITERS
/// launches leave: every map read back exactly, every record delivered with its size.
fn check_reader(reader: &str) {
    let s = Session::new(&format!("gpumaps-{reader}"));
    let mut c = s.bpftime();
    if reader == "perf" {
        c.env("BPFTIME_GPU_RING_AS", "perf");
    }
    c.env("BPFTIME_MAP_GPU_THREAD_COUNT", THREADS.to_string())
        .env("GPU_MAPS_READER", reader)
        .args([
            "load",
            examples::GPU_MAPS,
            "--obj",
            examples::GPU_MAPS_BPF_O,
        ]);
    let tool = Tool::spawn(c);
    let ids = map_ids(&tool.seen);
    assert_eq!(ids.len(), 4, "{:?}", tool.seen);
    let store = Store::open(&s.store).unwrap();
    // The loader's GPU probes are links the agent would take.
    s.wait_for_links(2);
    land_launches(&store, &ids, || {
        std::thread::sleep(Duration::from_millis(300))
    });
    if reader == "perf" {
        // The shim's thread moves the ring's records into the perf buffer as they come
        // (within its 100 ms look at the latest); a reader stopped at once could miss them.
        std::thread::sleep(Duration::from_millis(300));
    }
    let (code, lines, err) = tool.stop();
    assert_eq!(code, 0, "{lines:?}\n{err}");
    let get = |prefix: &str, key: &str| {
        field(&lines, prefix, key).unwrap_or_else(|| panic!("no {prefix} {key}= in {lines:?}"))
    };
    let launched = u64::from(THREADS) * ITERS;
    let threads = u64::from(THREADS);
    assert_eq!(
        (
            get("per_thread ", "threads"),
            get("per_thread ", "calls_min"),
            get("per_thread ", "calls_max"),
            get("per_thread ", "calls_zero"),
            get("per_thread ", "ids_in_order"),
        ),
        (threads, ITERS, ITERS, 0, threads),
        "{lines:?}"
    );
    assert_eq!(
        (
            get("totals ", "entries"),
            get("totals ", "elements"),
            get("totals ", "exits"),
            get("totals ", "refused"),
        ),
        (launched, launched * threads, launched, 0),
        "{lines:?}"
    );
    let per_key = u64::from(BLOCK) * ITERS;
    assert_eq!(
        (
            get("by_block ", "keys"),
            get("by_block ", "min"),
            get("by_block ", "max"),
            get("by_block ", "sum"),
        ),
        (threads / u64::from(BLOCK), per_key, per_key, launched),
        "{lines:?}"
    );
    let events = format!("events reader={reader} ");
    assert_eq!(
        (
            get(&events, "records"),
            get(&events, "size_bad"),
            get(&events, "field_bad"),
            get(&events, "threads"),
            get(&events, "per_thread_min"),
            get(&events, "per_thread_max"),
            get(&events, "poll_errors"),
        ),
        (launched + 2, 2, 0, threads, ITERS, ITERS, 0),
        "{lines:?}"
    );
    if reader == "perf" {
        assert_eq!(get("perf ", "lost"), 0, "{lines:?}");
    }
}

/// bpftime's poll function, found by the loader with dlsym(RTLD_DEFAULT) in the
/// preloaded syscall library, hands over every record the GPU sync put in the GPU ring
/// buffer, each with its size, whether it arrived before or after the loader's earlier
/// polls; bpf() gives the per-thread array's values one per thread in thread order, the
/// GPU array and hash map their values.
#[test]
fn a_loader_reads_gpu_maps_and_polls_the_gpu_ring_as_under_bpftime() {
    check_reader("poll");
}

/// The GPU ring buffer read with libbpf's ring buffer API instead, as a tool reads a
/// standard ring buffer (ring_buffer__new takes it: its info says ring buffer).
#[test]
fn libbpfs_ring_buffer_reads_a_gpu_ring_buffer() {
    check_reader("ringbuf");
}

/// With BPFTIME_GPU_RING_AS=perf the GPU ring buffer is a perf event array to libbpf, and
/// its perf buffer API reads it (perf_buffer__new puts a perf buffer per CPU in, and the
/// records reach the first one, in order, each whole with the kernel's padding).
#[test]
fn libbpfs_perf_buffer_reads_a_gpu_ring_buffer_shown_as_a_perf_event_array() {
    check_reader("perf");
}

/// Outside bpftime the poll function is missing, and the loader says so, as bpftime's
/// kernelretsnoop does ("This example can only be used under bpftime!"): the symbol is
/// the preloaded library's.
#[test]
fn without_bpftime_the_poll_function_is_missing() {
    let out = run_with_timeout(
        std::process::Command::new(examples::GPU_MAPS),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("bpftime_syscall_server__poll_gpu_ringbuf_map is missing"),
        "{stdout}"
    );
}

/// `bpftime run` on the same object, its app a stand-in that only waits while the store
/// is made to hold what the launches leave: it reads the GPU ring buffer through libbpf's
/// ring buffer (every record, with its size, printed as it arrives) and prints every map
/// at the end: the per-thread array as runs of threads, the GPU array and hash map as an
/// array and a hash map are printed.
#[test]
fn bpftime_run_prints_gpu_maps_and_streams_the_gpu_ring() {
    let s = Session::new("gpumaps-run");
    let mut c = s.bpftime();
    c.env("BPFTIME_MAP_GPU_THREAD_COUNT", THREADS.to_string())
        .args(["run", examples::GPU_MAPS_BPF_O, "--", "sleep", "3"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().expect("bpftime run");
    // Its maps, once the object is loaded.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let ids = loop {
        let ids: HashMap<String, u32> = Store::open(&s.store)
            .map(|store| {
                store
                    .ids(bpftime_runtime::ObjectKind::Map)
                    .into_iter()
                    .filter_map(|id| Some((Map::open(&store, id).ok()?.name(), id)))
                    .collect()
            })
            .unwrap_or_default();
        if ["per_thread", "totals", "by_block", "events"]
            .iter()
            .all(|n| ids.contains_key(*n))
        {
            break ids;
        }
        assert!(std::time::Instant::now() < deadline, "no maps in the store");
        std::thread::sleep(Duration::from_millis(20));
    };
    let store = Store::open(&s.store).unwrap();
    land_launches(&store, &ids, || {});
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = stdout.lines().collect();
    let has = |l: &str| lines.contains(&l);
    assert!(
        has(&format!("per_thread[0]: 0-{}={ITERS}", THREADS - 1)),
        "{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("per_thread[1]: 0=1 1=2 2=3 ")
                && l.ends_with(&format!("({} more runs)", THREADS - 16))),
        "{text}"
    );
    let launched = u64::from(THREADS) * ITERS;
    assert!(has(&format!("totals[0]: {launched}")), "{text}");
    assert!(has(&format!("totals[2]: {launched}")), "{text}");
    for b in 0..THREADS / BLOCK {
        assert!(
            has(&format!("by_block[{b}]: {}", u64::from(BLOCK) * ITERS)),
            "{text}"
        );
    }
    let records = |size: &str| {
        lines
            .iter()
            .filter(|l| l.starts_with(&format!("event events {size} ")))
            .count()
    };
    assert_eq!(
        (records("24B"), records("8B")),
        (launched as usize, 2),
        "{text}"
    );
    assert!(
        has(&format!("events (gpu_ringbuf): {} events", launched + 2)),
        "{text}"
    );
}
