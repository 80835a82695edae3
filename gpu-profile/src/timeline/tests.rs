use super::*;
use bpftime_gpu_attach::launch::LAUNCH_NAME_BYTES;
use serde_json::Value;

fn trace(t: &Timeline) -> (Value, Summary) {
    let mut out = Vec::new();
    let s = t.write_to(&mut out).unwrap();
    let v: Value = serde_json::from_slice(&out)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)));
    (v, s)
}

fn events<'a>(v: &'a Value, ph: &str) -> Vec<&'a Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == ph)
        .collect()
}

fn ns(ts: &Value) -> u64 {
    // Written as microseconds with three decimals: exact in nanoseconds.
    let s = ts.to_string();
    let (us, frac) = s.split_once('.').unwrap_or((&s, "0"));
    us.parse::<u64>().unwrap() * 1000 + format!("{frac:0<3}").parse::<u64>().unwrap()
}

#[test]
fn calls_pair_by_stack_pointer_and_nest() {
    let t = Timeline::new();
    let outer = t.name("outer");
    let inner = t.name("inner");
    t.call_entered(outer, 0x1000);
    t.call_entered(inner, 0x0f00);
    t.call_returned(inner, 0x0f08);
    // A return whose entry was never seen is an instant, and leaves `outer` open.
    t.call_returned(inner, 0x0e08);
    t.call_returned(outer, 0x1008);
    t.hit(inner);
    let (v, s) = trace(&t);
    assert_eq!(s.cpu_events, 4);
    let spans = events(&v, "X");
    let span = |n: &str| *spans.iter().find(|e| e["name"] == n).unwrap();
    let (o, i) = (span("outer"), span("inner"));
    let (ob, oe) = (ns(&o["ts"]), ns(&o["ts"]) + ns(&o["dur"]));
    let (ib, ie) = (ns(&i["ts"]), ns(&i["ts"]) + ns(&i["dur"]));
    assert!(ob <= ib && ie <= oe && ib <= ie, "{o} {i}");
    assert_eq!(o["tid"], i["tid"]);
    assert_eq!(o["tid"], gettid() as u64);
    let instants: Vec<&str> = events(&v, "I")
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(instants, ["inner returned", "inner"]);
    let names: Vec<&Value> = events(&v, "M")
        .into_iter()
        .filter(|e| e["name"] == "thread_name")
        .collect();
    assert!(names.iter().any(|e| e["tid"] == gettid() as u64));
    assert_eq!(v["metadata"]["clock"], "CLOCK_MONOTONIC");
}

#[test]
fn a_thread_with_too_many_calls_open_keeps_the_newest() {
    let open = OpenCalls::new();
    for i in 0..MAX_OPEN as u64 + 3 {
        open.push(Open {
            name: 1,
            sp: 0x10_0000 - i * 16,
            begin: i,
        });
    }
    let kept = open.snapshot();
    assert_eq!(kept.len(), MAX_OPEN / 2 + 3);
    assert_eq!(kept[0].begin, MAX_OPEN as u64 / 2);
    assert_eq!(kept.last().unwrap().begin, MAX_OPEN as u64 + 2);
    // A return pairs with its entry and closes what was opened after it.
    let at = kept[10];
    assert_eq!(open.pop(1, at.sp).unwrap().begin, at.begin);
    assert_eq!(open.snapshot().len(), 10);
    assert!(open.pop(2, kept[0].sp).is_none());
    assert!(open.pop(1, at.sp).is_none());
}

#[test]
fn calls_open_when_the_trace_is_written_end_there() {
    let t = Timeline::new();
    let main = t.name("main");
    let work = t.name("work");
    let done = t.name("done");
    t.call_entered(main, 0x2000);
    t.call_entered(done, 0x1f00);
    t.call_returned(done, 0x1f08);
    // `work` calls exit: it never returns, nor does main.
    t.call_entered(work, 0x1e00);
    // Another thread blocked inside a call.
    let other = std::thread::scope(|s| {
        s.spawn(|| {
            t.call_entered(work, 0x9000);
            gettid() as u64
        })
        .join()
        .unwrap()
    });
    let (v, s) = trace(&t);
    assert_eq!(s.unfinished, 3);
    assert_eq!(s.cpu_events, 4);
    let spans = events(&v, "X");
    let unfinished: Vec<(&str, u64)> = spans
        .iter()
        .filter(|e| e["args"]["unfinished"] == true)
        .map(|e| (e["name"].as_str().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    let me = gettid() as u64;
    assert_eq!(unfinished, [("main", me), ("work", me), ("work", other)]);
    let span = |n: &str, tid: u64| {
        *spans
            .iter()
            .find(|e| e["name"] == n && e["tid"] == tid)
            .unwrap()
    };
    let (m, w, d) = (span("main", me), span("work", me), span("done", me));
    assert!(d["args"].is_null(), "{d}");
    // Nested as they were entered, both ending when the trace was written.
    let end = |e: &Value| ns(&e["ts"]) + ns(&e["dur"]);
    assert!(ns(&m["ts"]) <= ns(&d["ts"]) && ns(&d["ts"]) <= ns(&w["ts"]));
    assert_eq!(end(m), end(w));
    assert!(end(d) <= ns(&w["ts"]));
    // Returned calls close their slots: only what is still open is reported.
    t.call_returned(work, 0x1e08);
    let (_, s) = trace(&t);
    assert_eq!(s.unfinished, 2);
}

#[test]
fn each_thread_records_on_its_own_track() {
    let t = Arc::new(Timeline::new());
    let f = t.name("work");
    let tids: Vec<i32> = (0..4)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || {
                // Past one chunk, so the buffer grows while others record.
                for i in 0..(CHUNK as u64 + 10) {
                    t.call_entered(f, 0x10_0000 - i * 16);
                    t.call_returned(f, 0x10_0000 - i * 16 + 8);
                }
                gettid()
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let (v, s) = trace(&t);
    assert_eq!(s.cpu_events, 4 * (CHUNK as u64 + 10));
    for tid in tids {
        let n = events(&v, "X")
            .iter()
            .filter(|e| e["tid"] == tid as u64)
            .count();
        assert_eq!(n, CHUNK + 10, "thread {tid}");
    }
}

fn launch_ctx(id: u64, phase: u32, stream: u64, cpu: u64, gpu: (u64, u64)) -> LaunchContext {
    let mut name = [0u8; LAUNCH_NAME_BYTES];
    let mangled = b"_Z9vectorAddPKfS0_Pfi";
    name[..mangled.len()].copy_from_slice(mangled);
    LaunchContext {
        launch_id: id,
        function: 0,
        stream,
        grid: [4096, 1, 1],
        block: [256, 1, 1],
        shared_mem_bytes: 0,
        device: 0,
        cpu_ns: cpu,
        gpu_start_ns: gpu.0,
        gpu_end_ns: gpu.1,
        clock_error_ns: 700,
        phase,
        result: 0,
        name_len: mangled.len() as u32,
        kernel_id: 0,
        name,
    }
}

#[test]
fn launches_join_their_kernels_and_gpu_lines_land_in_them() {
    let t = Timeline::new();
    let kernel = "_Z9vectorAddPKfS0_Pfi";
    let now = now_ns();
    t.launch(
        &launch_ctx(1, PHASE_LAUNCHED, 0x55, now - 50_000, (0, 0)),
        kernel,
    );
    t.launch(
        &launch_ctx(2, PHASE_LAUNCHED, 0x55, now - 40_000, (0, 0)),
        kernel,
    );
    // Launch 3 never completes: no kernel span, no flow.
    t.launch(
        &launch_ctx(3, PHASE_LAUNCHED, 0x66, now - 30_000, (0, 0)),
        kernel,
    );
    let (k1, k2) = ((now - 45_000, now - 35_000), (now - 35_000, now - 20_000));
    t.launch(
        &launch_ctx(1, PHASE_COMPLETED, 0x55, now - 50_000, k1),
        kernel,
    );
    t.launch(
        &launch_ctx(2, PHASE_COMPLETED, 0x55, now - 40_000, k2),
        kernel,
    );
    t.set_gpu(0, "NVIDIA H100 80GB HBM3", Some((-5, 300)));
    let print = |at: Option<u64>| GpuPrint {
        device: 0,
        at_ns: at,
        error_ns: 300,
        sm: 3,
        block: 9,
        grid: 2,
        text: "hello from the GPU\n".into(),
    };
    t.gpu_print(&print(Some(now - 30_000)));
    t.gpu_print(&print(None));
    t.gpu_print(&print(Some(now + 1_000_000)));
    let (v, s) = trace(&t);
    assert_eq!(
        (s.launches, s.kernels, s.gpu_lines, s.gpu_lines_unplaced),
        (3, 2, 3, 2)
    );
    let gpu_pid = GPU_PID_BASE;
    let starts = events(&v, "s");
    let ends = events(&v, "f");
    assert_eq!((starts.len(), ends.len()), (2, 2));
    for (s, f) in starts.iter().zip(&ends) {
        assert_eq!(s["id"], f["id"]);
        assert_eq!(f["bp"], "e");
        assert_eq!(f["pid"], gpu_pid);
        // Each flow end sits where its kernel span starts, on the same track and
        // category, as readers bind them.
        let kernel = events(&v, "X")
            .into_iter()
            .find(|e| e["pid"] == gpu_pid && e["ts"] == f["ts"] && e["tid"] == f["tid"])
            .unwrap();
        assert_eq!(kernel["cat"], f["cat"]);
        assert_eq!(kernel["name"], "vectorAdd");
        assert_eq!(kernel["args"]["launch_id"], f["id"]);
        let call = events(&v, "X")
            .into_iter()
            .find(|e| e["pid"] != gpu_pid && e["ts"] == s["ts"] && e["cat"] == "launch")
            .unwrap();
        assert_eq!(call["name"], "launch vectorAdd");
        assert_eq!(call["args"]["grid"], serde_json::json!([4096, 1, 1]));
    }
    let line = events(&v, "I")[0];
    assert_eq!(line["pid"], gpu_pid);
    assert_eq!(line["args"]["launch_id"], 2);
    assert_eq!(line["name"], "hello from the GPU");
    assert_eq!(ns(&line["ts"]), now - 30_000);
    let process_names: Vec<&str> = events(&v, "M")
        .into_iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(
        process_names.contains(&"GPU 0 (NVIDIA H100 80GB HBM3)"),
        "{process_names:?}"
    );
    let gpu = &v["metadata"]["gpus"][0];
    assert_eq!(
        (
            gpu["clock_error_ns"].as_u64(),
            gpu["clock_offset_ns"].as_i64()
        ),
        (Some(300), Some(-5))
    );
    assert_eq!(v["metadata"]["launch_time_error_ns"], 700);
}

/// Two kernels at once on two streams: a line written when both ran goes to the launch
/// whose grid wrote it, not to the kernel that started last, and every line of a grid
/// goes to one launch.
#[test]
fn lines_of_kernels_running_at_once_go_to_the_launch_that_wrote_them() {
    let t = Timeline::new();
    let kernel = "_Z9vectorAddPKfS0_Pfi";
    let now = now_ns();
    // Launch 1 and 3 on one stream, in sequence; launch 2 on another, started just
    // after launch 1 and running past both.
    let spans = [
        (1, 0x55, (now - 50_000, now - 30_000)),
        (2, 0x66, (now - 49_000, now - 10_000)),
        (3, 0x55, (now - 29_000, now - 20_000)),
    ];
    for (id, stream, span) in spans {
        t.launch(
            &launch_ctx(id, PHASE_LAUNCHED, stream, now - 60_000, (0, 0)),
            kernel,
        );
        t.launch(
            &launch_ctx(id, PHASE_COMPLETED, stream, now - 60_000, span),
            kernel,
        );
    }
    let print = |grid: u64, block: u32, before_now: u64| GpuPrint {
        device: 0,
        at_ns: Some(now - before_now),
        error_ns: 300,
        sm: block,
        block,
        grid,
        text: format!("grid {grid}"),
    };
    // The driver numbered the launches' grids 11, 12 and 13.
    for block in 0..4 {
        t.gpu_print(&print(11, block, 31_000));
    }
    t.gpu_print(&print(12, 0, 40_000));
    t.gpu_print(&print(12, 1, 12_000));
    t.gpu_print(&print(13, 0, 25_000));
    let (v, s) = trace(&t);
    assert_eq!((s.gpu_lines, s.gpu_lines_unplaced), (7, 0));
    let track_of = |id: u64| {
        events(&v, "X")
            .into_iter()
            .find(|e| e["pid"] == GPU_PID_BASE && e["args"]["launch_id"] == id)
            .unwrap()["tid"]
            .clone()
    };
    for line in events(&v, "I") {
        let grid = line["args"]["grid_id"].as_u64().unwrap();
        let launch = grid - 10;
        assert_eq!(line["args"]["launch_id"], launch, "{line}");
        assert_eq!(line["tid"], track_of(launch), "{line}");
    }
}

#[test]
fn driver_calls_are_spans_with_their_failures_noted() {
    let t = Timeline::new();
    let now = now_ns();
    t.api_call(&ApiCall {
        name: "cuLaunchKernel",
        begin_ns: now,
        end_ns: now + 1_234,
        result: 0,
    });
    t.api_call(&ApiCall {
        name: "cuModuleLoadData",
        begin_ns: now + 2_000,
        end_ns: now + 3_000,
        result: 218,
    });
    let (v, _) = trace(&t);
    let spans = events(&v, "X");
    assert_eq!(spans[0]["name"], "cuLaunchKernel");
    assert_eq!(spans[0]["cat"], "cuda");
    assert_eq!(ns(&spans[0]["dur"]), 1_234);
    assert!(spans[0].get("args").is_none());
    assert_eq!(spans[1]["args"]["result"], 218);
}

#[test]
fn exported_functions_are_named_for_their_tracks() {
    let f = libc::getpid as *const () as usize;
    // libc exports it under an alias too (`__getpid`): either is its name.
    assert!(symbol_at(f).ends_with("getpid"), "{}", symbol_at(f));
    assert!(
        symbol_at(f + 1).ends_with("getpid+0x1"),
        "{}",
        symbol_at(f + 1)
    );
}

#[test]
fn symbols_are_demangled() {
    assert_eq!(function_name("work", 0), "work");
    assert_eq!(
        function_name("_Z10train_stepR4PathPfi", 0),
        "train_step(Path&, float*, int)"
    );
    assert_eq!(
        function_name("_ZN5tiles6matmulEv", 0x10),
        "tiles::matmul()+0x10"
    );
    assert_eq!(
        function_name("_ZN4core3ptr13drop_in_place17h0123456789abcdefE", 0),
        "core::ptr::drop_in_place"
    );
}

#[test]
fn times_are_microseconds_to_the_nanosecond() {
    assert_eq!(micros(1_234_567_890_123), "1234567890.123");
    assert_eq!(micros(5), "0.005");
}

#[test]
fn a_trace_that_cannot_be_written_says_where() {
    let t = Timeline::new();
    let e = t.write(Path::new("/nonexistent-dir/x.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent-dir/x.json"), "{e}");
}
