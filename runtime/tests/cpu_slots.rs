//! Programs run as CPU slots they hold alone, as the agent sets them up: per-CPU
//! read-modify-writes from more threads than CPUs, preempted between the read and the
//! write, lose nothing; a slot whose holder died is taken back. A test binary of its own,
//! since the static TLS and the slot table are process-wide.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bpftime_isa::uapi::map_type;
use bpftime_runtime::cpu_slots::{self, SlotGuard};
use bpftime_runtime::{possible_cpus, Map, MapSpec, Store};

bpftime_attach::static_tls_flag!(fn slot_offset, "bpftime_test_cpu_slot");

struct TempStore(Option<Store>);

impl Drop for TempStore {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            let _ = s.destroy();
        }
    }
}

fn setup() -> TempStore {
    let store = Store::create_or_open(&format!("test-cpu-slots-{}", std::process::id())).unwrap();
    // SAFETY: this binary's own 8 bytes of static TLS, zero in every thread, used by
    // nothing else; no program runs yet.
    unsafe { cpu_slots::use_static_tls_slot(slot_offset()) };
    cpu_slots::install(&store).unwrap();
    TempStore(Some(store))
}

/// The test binary's tests share the process-wide table: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn per_cpu_increments_from_more_threads_than_cpus_lose_nothing() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let store = setup();
    let store = store.0.as_ref().unwrap();
    let map = Map::create(
        store,
        &MapSpec {
            map_type: map_type::PERCPU_ARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: 1,
            name: "counts".into(),
            ..Default::default()
        },
    )
    .unwrap();
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 50_000;
    let holders: Vec<AtomicU32> = (0..possible_cpus()).map(|_| AtomicU32::new(0)).collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (map, holders) = (&map, &holders);
            s.spawn(move || {
                for i in 0..ROUNDS {
                    let _slot = SlotGuard::take();
                    // What bpftrace's count() compiles to: this CPU's copy, read, add, write.
                    // SAFETY: a 4-byte key; the map outlives the scope.
                    let v = unsafe { map.prog_lookup(0u32.to_ne_bytes().as_ptr()) }.cast::<u64>();
                    let cpu = (v as usize - map.array_values().unwrap().base as usize) / 8;
                    // No other thread runs as this CPU meanwhile.
                    let me = t as u32 + 1;
                    assert_eq!(
                        holders[cpu].swap(me, Ordering::SeqCst),
                        0,
                        "slot {cpu} shared"
                    );
                    // SAFETY: this CPU's copy, which only the slot's holder writes.
                    let old = unsafe { v.read_volatile() };
                    if i % 16 == 0 {
                        // Preempted between the read and the write, as a thread may be.
                        std::thread::yield_now();
                    }
                    // SAFETY: as above.
                    unsafe { v.write_volatile(old + 1) };
                    assert_eq!(holders[cpu].swap(0, Ordering::SeqCst), me);
                }
            });
        }
    });
    let cpus = possible_cpus() as usize;
    let mut all = vec![0u8; 8 * cpus];
    map.lookup(&0u32.to_ne_bytes(), &mut all).unwrap();
    let total: u64 = all
        .chunks(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
        .sum();
    assert_eq!(total, THREADS * ROUNDS);
}

#[test]
fn slots_held_by_dead_threads_are_taken_back() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _store = setup();
    // Everything on CPU 0 from here (the children and the thread below inherit it): each
    // child takes CPU 0's slot, from the one before it once that one has died, and
    // dies holding it.
    // SAFETY: a zeroed set with CPU 0 added, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
            0
        );
    }
    for _ in 0..3 {
        // SAFETY: the child takes a slot (atomics, its own ids, a static-TLS store) and
        // `_exit`s without running the harness's exit path.
        match unsafe { libc::fork() } {
            0 => {
                std::mem::forget(SlotGuard::take());
                // SAFETY: as above.
                unsafe { libc::_exit(0) };
            }
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            pid => {
                let mut status = 0;
                // SAFETY: waits for our own child.
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
                assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let g = SlotGuard::take();
        let _ = tx.send(cpu_slots::held_slot());
        drop(g);
    });
    let held = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the slot was not taken back from the dead holder");
    assert_eq!(held, Some(0));
}
