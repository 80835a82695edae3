//! Added cost per call of a uprobe, and of a uprobe plus a uretprobe, with a trivial counting
//! handler (and a uprobe with a handler that does nothing), against the same function
//! unhooked. Subtract the `plain` median from the others
//! for the ns a hook adds.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bpftime_attach::{attach_uprobe, attach_uretprobe, detach, Handler};
use criterion::{criterion_group, criterion_main, Criterion};

// One copy per case so each keeps its own hooks for the whole run.
#[inline(never)]
extern "C" fn plain(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(7)
}

#[inline(never)]
extern "C" fn with_uprobe(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(9)
}

#[inline(never)]
extern "C" fn with_noop(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(13)
}

#[inline(never)]
extern "C" fn with_both(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(11)
}

fn bench(c: &mut Criterion) {
    let hits = Arc::new(AtomicU64::new(0));
    let counting = || -> Handler {
        let h = hits.clone();
        Arc::new(move |_| {
            h.fetch_add(1, Ordering::Relaxed);
        })
    };
    // SAFETY: all four are whole functions of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(with_uprobe as *const () as usize, counting()).unwrap(),
            attach_uprobe(with_noop as *const () as usize, Arc::new(|_| {})).unwrap(),
            attach_uprobe(with_both as *const () as usize, counting()).unwrap(),
            attach_uretprobe(with_both as *const () as usize, counting()).unwrap(),
        ]
    };
    let mut g = c.benchmark_group("hooked_call");
    for (name, f) in [
        ("plain", plain as extern "C" fn(u64) -> u64),
        ("uprobe", with_uprobe),
        // The hook's own share, without the handler's atomic add.
        ("uprobe_noop_handler", with_noop),
        ("uprobe+uretprobe", with_both),
    ] {
        let f = black_box(f);
        g.bench_function(name, |b| {
            let mut x = 1u64;
            b.iter(|| {
                x = f(x);
                x
            })
        });
    }
    g.finish();
    for id in ids {
        detach(id).unwrap();
    }
    assert!(hits.load(Ordering::Relaxed) > 0);
}

criterion_group!(benches, bench);
criterion_main!(benches);
