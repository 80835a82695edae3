//! One timeline of a process's CPU and GPU work, written as a Perfetto/Chrome trace (the
//! Trace Event Format's JSON, which ui.perfetto.dev and chrome://tracing open).
//!
//! What it holds, all on `CLOCK_MONOTONIC`:
//! - calls of traced functions on each thread ([`Timeline::call_entered`] and
//!   [`Timeline::call_returned`] make a span, [`Timeline::hit`] an instant);
//! - CUDA driver calls on each thread ([`Timeline::api_call`]);
//! - launches ([`Timeline::launch`], a launch program's body): the launch call on its
//!   thread, and once the kernel completed its span on the GPU (a process per GPU, a
//!   thread per stream), joined by a flow arrow;
//! - lines GPU probes printed ([`Timeline::gpu_print`]), as instants on the track of the
//!   kernel running when they were written.
//!
//! Threads record into buffers of their own (appended by that thread alone, read at the
//! end through an atomic length), so a traced call takes no lock. Names are interned once
//! ([`Timeline::name`]) and written out when the trace is.

use std::cell::{RefCell, UnsafeCell};
use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bpftime_gpu_attach::observer::{ApiCall, GpuPrint, Observer};
use bpftime_gpu_attach::{LaunchContext, PHASE_COMPLETED, PHASE_LAUNCHED};
use bpftime_gpu_ptx::names;

/// Events per chunk of a thread's buffer.
const CHUNK: usize = 4096;
/// Events a thread keeps; later ones are counted as dropped (48 bytes each: 192 MiB).
const MAX_PER_THREAD: usize = 1 << 22;
/// Calls a thread may have open (entered, not returned) before the oldest are dropped.
const MAX_OPEN: usize = 4096;
/// GPU processes' ids in the trace: the device's ordinal above any real pid (Linux's
/// `pid_max` is at most 2^22).
const GPU_PID_BASE: u64 = 1 << 30;
/// Longest event name kept from a GPU line; the whole text is in its arguments.
const PRINT_NAME_CHARS: usize = 80;

#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error("cannot write the trace to {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What [`Timeline::write`] wrote.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub path: PathBuf,
    /// Spans and instants on CPU threads (traced calls and driver calls).
    pub cpu_events: u64,
    pub launches: u64,
    /// Launches whose kernel span is in the trace (the others never completed with GPU
    /// times).
    pub kernels: u64,
    pub gpu_lines: u64,
    /// Traced calls that had not returned when the trace was written, in it as spans
    /// that end there (`"unfinished": true`).
    pub unfinished: u64,
    /// GPU lines that could not be placed: no clock calibration, or no kernel ran then.
    pub gpu_lines_unplaced: u64,
    /// Events not kept: a thread over its limit.
    pub dropped: u64,
}

/// An interned name, from [`Timeline::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Name(u32);

#[derive(Clone, Copy)]
enum Label {
    Interned(u32),
    Static(&'static str),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A traced function's call, entry to return.
    Call,
    /// A traced function reached where no span can be made (a uprobe alone).
    Hit,
    /// A traced function's return whose entry was not seen.
    Return,
    /// A CUDA driver call.
    Api,
}

#[derive(Clone, Copy)]
struct Event {
    label: Label,
    kind: Kind,
    begin: u64,
    end: u64,
    result: u32,
}

struct Chunk {
    events: Box<[UnsafeCell<MaybeUninit<Event>>]>,
    /// Events written, by the owning thread only (Release), read by the writer (Acquire).
    len: AtomicUsize,
    next: AtomicPtr<Chunk>,
}

impl Chunk {
    fn new() -> Box<Chunk> {
        Box::new(Chunk {
            events: (0..CHUNK)
                .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
                .collect(),
            len: AtomicUsize::new(0),
            next: AtomicPtr::new(std::ptr::null_mut()),
        })
    }
}

/// One thread's events: appended by that thread alone, read by whoever writes the trace.
struct ThreadBuffer {
    tid: i32,
    /// The thread's name when it first recorded (read again at the end if it still runs).
    name: String,
    head: Box<Chunk>,
    dropped: AtomicU64,
    /// Calls entered and not yet returned, so that a trace written while they are (at
    /// exit, from a function that called `exit`) still shows them.
    open: OpenCalls,
}

/// A thread's open calls, oldest first: written by that thread alone, each slot before
/// the Release store of `len` that covers it; read by the trace's writer after an
/// Acquire load of `len`. A writer racing with a thread that still runs may read a slot
/// being reused (a name index and a time from two calls), never memory out of bounds.
struct OpenCalls {
    len: AtomicUsize,
    /// Name index, entry stack pointer and entry time of each.
    slots: Box<[[AtomicU64; 3]]>,
}

impl OpenCalls {
    fn new() -> OpenCalls {
        OpenCalls {
            len: AtomicUsize::new(0),
            slots: (0..MAX_OPEN)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
        }
    }

    fn get(&self, i: usize) -> Open {
        let [name, sp, begin] = &self.slots[i];
        Open {
            name: name.load(Ordering::Relaxed) as u32,
            sp: sp.load(Ordering::Relaxed),
            begin: begin.load(Ordering::Relaxed),
        }
    }

    fn set(&self, i: usize, o: &Open) {
        let [name, sp, begin] = &self.slots[i];
        name.store(o.name as u64, Ordering::Relaxed);
        sp.store(o.sp, Ordering::Relaxed);
        begin.store(o.begin, Ordering::Relaxed);
    }

    /// By the owning thread only.
    fn push(&self, o: Open) {
        let mut len = self.len.load(Ordering::Relaxed);
        if len >= MAX_OPEN {
            // Calls left by longjmp or never returning: the oldest half goes.
            for i in MAX_OPEN / 2..len {
                self.set(i - MAX_OPEN / 2, &self.get(i));
            }
            len -= MAX_OPEN / 2;
        }
        self.set(len, &o);
        self.len.store(len + 1, Ordering::Release);
    }

    /// By the owning thread only: the newest open call of `name` entered at `sp`, and
    /// everything opened after it (calls left by longjmp) closed with it.
    fn pop(&self, name: u32, sp: u64) -> Option<Open> {
        let len = self.len.load(Ordering::Relaxed);
        let i = (0..len).rev().find(|&i| {
            let o = self.get(i);
            o.name == name && o.sp == sp
        })?;
        let o = self.get(i);
        self.len.store(i, Ordering::Release);
        Some(o)
    }

    /// What is open now, oldest first.
    fn snapshot(&self) -> Vec<Open> {
        let len = self.len.load(Ordering::Acquire).min(MAX_OPEN);
        (0..len).map(|i| self.get(i)).collect()
    }
}

// SAFETY: slots below a chunk's published `len` are written once, before the Release store
// of `len` that publishes them, and only read after an Acquire load that sees it; slots at
// or past `len` are touched by the owning thread only.
unsafe impl Sync for ThreadBuffer {}
// SAFETY: as above; the chunks are owned by the buffer.
unsafe impl Send for ThreadBuffer {}

impl ThreadBuffer {
    /// Every event published so far, in the order the thread recorded them.
    fn each(&self, mut f: impl FnMut(&Event)) {
        let mut chunk: &Chunk = &self.head;
        loop {
            // A chunk with a successor is full: its last event went in before `next`.
            let next = chunk.next.load(Ordering::Acquire);
            let len = if next.is_null() {
                chunk.len.load(Ordering::Acquire)
            } else {
                CHUNK
            };
            for slot in &chunk.events[..len] {
                // SAFETY: below the published length: written and never written again.
                f(unsafe { (*slot.get()).assume_init_ref() });
            }
            if next.is_null() {
                return;
            }
            // SAFETY: published chunks live as long as the buffer.
            chunk = unsafe { &*next };
        }
    }
}

impl Drop for ThreadBuffer {
    fn drop(&mut self) {
        let mut next = self.head.next.swap(std::ptr::null_mut(), Ordering::Acquire);
        while !next.is_null() {
            // SAFETY: every successor was made by `Box::into_raw` and is owned here.
            let chunk = unsafe { Box::from_raw(next) };
            next = chunk.next.swap(std::ptr::null_mut(), Ordering::Acquire);
        }
    }
}

/// A call entered and not yet returned.
#[derive(Debug, Clone, Copy)]
struct Open {
    name: u32,
    /// The stack pointer at the entry, where the return address was.
    sp: u64,
    begin: u64,
}

/// A thread's handle on one timeline's buffer.
struct Local {
    timeline: u64,
    buffer: Arc<ThreadBuffer>,
    tail: *const Chunk,
    count: usize,
}

impl Local {
    fn push(&mut self, e: Event) {
        if self.count >= MAX_PER_THREAD {
            self.buffer.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: `tail` is a chunk of `buffer`, which this handle keeps alive.
        let mut tail = unsafe { &*self.tail };
        let mut n = tail.len.load(Ordering::Relaxed);
        if n == CHUNK {
            let next = Box::into_raw(Chunk::new());
            tail.next.store(next, Ordering::Release);
            self.tail = next;
            // SAFETY: just made, owned by the buffer from now on.
            tail = unsafe { &*next };
            n = 0;
        }
        // SAFETY: slot `n` is past the published length, so only this thread touches it.
        unsafe { (*tail.events[n].get()).write(e) };
        tail.len.store(n + 1, Ordering::Release);
        self.count += 1;
    }
}

thread_local! {
    static LOCALS: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

static NEXT_TIMELINE: AtomicU64 = AtomicU64::new(1);

/// A launch call, on the thread that made it.
struct LaunchCall {
    launch_id: u64,
    tid: i32,
    kernel: Arc<str>,
    called: u64,
    returned: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: u64,
    device: i32,
    result: u32,
}

/// A launch's kernel on the GPU.
#[derive(Clone, Copy)]
struct KernelRun {
    start: u64,
    end: u64,
    error_ns: u32,
}

#[derive(Default)]
struct Launches {
    calls: Vec<LaunchCall>,
    runs: HashMap<u64, KernelRun>,
    kernels: HashMap<String, Arc<str>>,
}

/// A GPU as the trace names it.
#[derive(Debug, Clone, Default)]
struct Gpu {
    name: String,
    clock_offset_ns: Option<i64>,
    clock_error_ns: Option<u64>,
}

#[derive(Default)]
struct Names {
    list: Vec<String>,
    ids: HashMap<String, u32>,
}

/// A process's timeline: what it records, and the trace it writes.
pub struct Timeline {
    id: u64,
    names: Mutex<Names>,
    threads: Mutex<Vec<Arc<ThreadBuffer>>>,
    launches: Mutex<Launches>,
    prints: Mutex<Vec<GpuPrint>>,
    gpus: Mutex<BTreeMap<i32, Gpu>>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn now_ns() -> u64 {
    bpftime_gpu_device::clock::host_monotonic_ns()
}

fn gettid() -> i32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() }
}

fn thread_name(tid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline {
            id: NEXT_TIMELINE.fetch_add(1, Ordering::Relaxed),
            names: Mutex::default(),
            threads: Mutex::default(),
            launches: Mutex::default(),
            prints: Mutex::default(),
            gpus: Mutex::default(),
        }
    }

    /// The id of `name`, for the calls that take one (intern once, record many times).
    pub fn name(&self, name: &str) -> Name {
        let mut n = lock(&self.names);
        if let Some(&id) = n.ids.get(name) {
            return Name(id);
        }
        let id = n.list.len() as u32;
        n.list.push(name.to_string());
        n.ids.insert(name.to_string(), id);
        Name(id)
    }

    /// Runs `f` on this thread's handle, made on first use; nothing when the thread is
    /// being torn down.
    fn with_local(&self, f: impl FnOnce(&mut Local)) {
        let _ = LOCALS.try_with(|locals| {
            let Ok(mut locals) = locals.try_borrow_mut() else {
                return;
            };
            let i = match locals.iter().position(|l| l.timeline == self.id) {
                Some(i) => i,
                None => {
                    let tid = gettid();
                    let buffer = Arc::new(ThreadBuffer {
                        tid,
                        name: thread_name(tid).unwrap_or_default(),
                        head: Chunk::new(),
                        dropped: AtomicU64::new(0),
                        open: OpenCalls::new(),
                    });
                    lock(&self.threads).push(buffer.clone());
                    let tail: *const Chunk = &*buffer.head;
                    locals.push(Local {
                        timeline: self.id,
                        buffer,
                        tail,
                        count: 0,
                    });
                    locals.len() - 1
                }
            };
            f(&mut locals[i]);
        });
    }

    /// The calling thread entered the traced function `name`, with the stack pointer `sp`
    /// at its first instruction (where its return address is).
    pub fn call_entered(&self, name: Name, sp: u64) {
        let begin = now_ns();
        self.with_local(|l| {
            l.buffer.open.push(Open {
                name: name.0,
                sp,
                begin,
            })
        });
    }

    /// The calling thread returned from `name`, with the stack pointer `sp` just after
    /// the return (the entry's plus 8). Its span is the entry's call to now; a return
    /// whose entry was not seen is an instant.
    pub fn call_returned(&self, name: Name, sp: u64) {
        let end = now_ns();
        self.with_local(|l| match l.buffer.open.pop(name.0, sp.wrapping_sub(8)) {
            Some(open) => {
                l.push(Event {
                    label: Label::Interned(name.0),
                    kind: Kind::Call,
                    begin: open.begin,
                    end,
                    result: 0,
                });
            }
            None => l.push(Event {
                label: Label::Interned(name.0),
                kind: Kind::Return,
                begin: end,
                end,
                result: 0,
            }),
        });
    }

    /// The calling thread reached `name` (a probe that has no return to pair with).
    pub fn hit(&self, name: Name) {
        let at = now_ns();
        self.with_local(|l| {
            l.push(Event {
                label: Label::Interned(name.0),
                kind: Kind::Hit,
                begin: at,
                end: at,
                result: 0,
            })
        });
    }

    /// A CUDA driver call on the calling thread.
    pub fn api_call(&self, call: &ApiCall) {
        self.with_local(|l| {
            l.push(Event {
                label: Label::Static(call.name),
                kind: Kind::Api,
                begin: call.begin_ns,
                end: call.end_ns.max(call.begin_ns),
                result: call.result,
            })
        });
    }

    /// A launch program's body: the launch call (phase launched, on the launching thread)
    /// and the kernel's GPU times (phase completed).
    pub fn launch(&self, ctx: &LaunchContext, kernel: &str) {
        match ctx.phase {
            PHASE_LAUNCHED => {
                let returned = now_ns();
                let tid = gettid();
                let mut l = lock(&self.launches);
                let kernel = match l.kernels.get(kernel) {
                    Some(k) => k.clone(),
                    None => {
                        let k: Arc<str> = kernel.into();
                        l.kernels.insert(kernel.to_string(), k.clone());
                        k
                    }
                };
                l.calls.push(LaunchCall {
                    launch_id: ctx.launch_id,
                    tid,
                    kernel,
                    called: ctx.cpu_ns.min(returned),
                    returned,
                    grid: ctx.grid,
                    block: ctx.block,
                    shared_mem_bytes: ctx.shared_mem_bytes,
                    stream: ctx.stream,
                    device: ctx.device,
                    result: ctx.result,
                });
            }
            PHASE_COMPLETED => {
                lock(&self.launches).runs.insert(
                    ctx.launch_id,
                    KernelRun {
                        start: ctx.gpu_start_ns,
                        end: ctx.gpu_end_ns.max(ctx.gpu_start_ns),
                        error_ns: ctx.clock_error_ns,
                    },
                );
            }
            _ => {}
        }
    }

    /// A line a GPU probe printed.
    pub fn gpu_print(&self, print: &GpuPrint) {
        lock(&self.prints).push(print.clone());
    }

    /// Names GPU `ordinal` and gives its clock calibration (offset from its global timer
    /// to `CLOCK_MONOTONIC`, and the error bound), for the trace's metadata.
    pub fn set_gpu(&self, ordinal: i32, name: &str, clock: Option<(i64, u64)>) {
        let mut gpus = lock(&self.gpus);
        let g = gpus.entry(ordinal).or_default();
        if !name.is_empty() {
            g.name = name.to_string();
        }
        if let Some((offset, error)) = clock {
            g.clock_offset_ns = Some(offset);
            g.clock_error_ns = Some(error);
        }
    }

    /// Writes the trace to `path`.
    pub fn write(&self, path: &Path) -> Result<Summary, TimelineError> {
        let err = |source| TimelineError::Write {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::create(path).map_err(err)?;
        let mut out = std::io::BufWriter::new(file);
        let mut summary = self.write_to(&mut out).map_err(err)?;
        out.flush().map_err(err)?;
        summary.path = path.to_path_buf();
        Ok(summary)
    }

    /// The trace as JSON into `out`.
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<Summary> {
        let written_at = now_ns();
        let pid = std::process::id() as u64;
        let names = lock(&self.names).list.clone();
        let threads: Vec<Arc<ThreadBuffer>> = lock(&self.threads).clone();
        let launches = lock(&self.launches);
        let prints = lock(&self.prints).clone();
        let mut gpus = lock(&self.gpus).clone();
        for c in &launches.calls {
            gpus.entry(c.device).or_default();
        }
        for p in &prints {
            gpus.entry(p.device).or_default();
        }
        let mut summary = Summary::default();
        let mut w = Writer::new(out);

        // Where each kernel ran: a track per (device, stream), numbered in order of use.
        let mut streams: BTreeMap<(i32, u64), u64> = BTreeMap::new();
        let mut runs_by_device: HashMap<i32, Vec<TrackedRun>> = HashMap::new();
        for c in &launches.calls {
            if let Some(run) = launches.runs.get(&c.launch_id) {
                let next = streams.len() as u64 + 1;
                let track = *streams.entry((c.device, c.stream)).or_insert(next);
                runs_by_device
                    .entry(c.device)
                    .or_default()
                    .push(TrackedRun {
                        run: *run,
                        launch_id: c.launch_id,
                        track,
                        blocks: c.grid.iter().map(|&n| u64::from(n)).product(),
                    });
            }
        }
        for runs in runs_by_device.values_mut() {
            runs.sort_by_key(|r| r.run.start);
        }

        let process = thread_name(pid as i32).unwrap_or_else(|| "process".into());
        w.meta(pid, 0, "process_name", &format!("{process} (pid {pid})"))?;
        w.sort_index(pid, 0)?;
        for t in &threads {
            let name = thread_name(t.tid).unwrap_or_else(|| t.name.clone());
            w.meta(
                pid,
                t.tid as u64,
                "thread_name",
                &format!("{name} ({})", t.tid),
            )?;
        }
        let mut launch_tids: Vec<i32> = launches.calls.iter().map(|c| c.tid).collect();
        launch_tids.sort_unstable();
        launch_tids.dedup();
        for tid in launch_tids {
            if !threads.iter().any(|t| t.tid == tid) {
                let name = thread_name(tid).unwrap_or_else(|| "thread".into());
                w.meta(pid, tid as u64, "thread_name", &format!("{name} ({tid})"))?;
            }
        }
        for (ordinal, g) in &gpus {
            let gpid = GPU_PID_BASE + *ordinal as u64;
            let name = if g.name.is_empty() {
                format!("GPU {ordinal}")
            } else {
                format!("GPU {ordinal} ({})", g.name)
            };
            w.meta(gpid, 0, "process_name", &name)?;
            w.sort_index(gpid, 1 + *ordinal as i64)?;
        }
        for ((device, stream), track) in &streams {
            let name = match *stream {
                0 => "default stream".to_string(),
                2 => "per-thread default stream".to_string(),
                s => format!("stream {s:#x}"),
            };
            w.meta(GPU_PID_BASE + *device as u64, *track, "thread_name", &name)?;
        }

        // CPU threads: traced calls and driver calls.
        for t in &threads {
            summary.dropped += t.dropped.load(Ordering::Relaxed);
            let tid = t.tid as u64;
            let mut result: std::io::Result<()> = Ok(());
            t.each(|e| {
                if result.is_err() {
                    return;
                }
                summary.cpu_events += 1;
                let name: &str = match e.label {
                    Label::Interned(i) => names.get(i as usize).map_or("?", String::as_str),
                    Label::Static(s) => s,
                };
                result = match e.kind {
                    Kind::Call => w.span(pid, tid, "uprobe", name, e.begin, e.end, None),
                    Kind::Api => {
                        let args = (e.result != 0).then(|| format!("{{\"result\":{}}}", e.result));
                        w.span(pid, tid, "cuda", name, e.begin, e.end, args.as_deref())
                    }
                    Kind::Hit => w.instant(pid, tid, "uprobe", name, e.begin, None),
                    Kind::Return => w.instant(
                        pid,
                        tid,
                        "uprobe",
                        &format!("{name} returned"),
                        e.begin,
                        None,
                    ),
                };
            });
            result?;
            // Calls not returned when the trace is written (the process exiting inside
            // them) end at the writing, marked as such.
            for o in t.open.snapshot() {
                let name = names.get(o.name as usize).map_or("?", String::as_str);
                summary.cpu_events += 1;
                summary.unfinished += 1;
                w.span(
                    pid,
                    tid,
                    "uprobe",
                    name,
                    o.begin,
                    written_at.max(o.begin),
                    Some("{\"unfinished\":true}"),
                )?;
            }
        }

        // Launches and their kernels, joined by flows.
        let mut max_launch_error = 0u32;
        for c in &launches.calls {
            summary.launches += 1;
            let short = kernel_name(&c.kernel);
            let run = launches.runs.get(&c.launch_id);
            // What the launch call and its kernel's span both say.
            let launch = format!(
                "\"launch_id\":{},\"kernel\":{},\"grid\":[{},{},{}],\"block\":[{},{},{}]",
                c.launch_id,
                json_str(&c.kernel),
                c.grid[0],
                c.grid[1],
                c.grid[2],
                c.block[0],
                c.block[1],
                c.block[2],
            );
            let args = format!(
                "{{{launch},\"shared_mem_bytes\":{},\"stream\":\"{:#x}\",\"device\":{},\"result\":{}}}",
                c.shared_mem_bytes, c.stream, c.device, c.result
            );
            let tid = c.tid as u64;
            w.span(
                pid,
                tid,
                "launch",
                &format!("launch {short}"),
                c.called,
                c.returned,
                Some(&args),
            )?;
            let Some(run) = run else { continue };
            summary.kernels += 1;
            max_launch_error = max_launch_error.max(run.error_ns);
            let gpid = GPU_PID_BASE + c.device as u64;
            let track = streams[&(c.device, c.stream)];
            w.flow("s", pid, tid, c.called, c.launch_id)?;
            let kargs = format!("{{{launch},\"error_ns\":{}}}", run.error_ns);
            w.span(
                gpid,
                track,
                "launch",
                &short,
                run.start,
                run.end,
                Some(&kargs),
            )?;
            w.flow("f", gpid, track, run.start, c.launch_id)?;
        }

        // GPU lines, on the track of the launch that wrote them.
        let placed = place_lines(&prints, &runs_by_device);
        for (p, place) in prints.iter().zip(placed) {
            summary.gpu_lines += 1;
            let gpid = GPU_PID_BASE + p.device as u64;
            let (Some(at), Some(r)) = (p.at_ns, place) else {
                summary.gpu_lines_unplaced += 1;
                continue;
            };
            let args = format!(
                "{{\"text\":{},\"sm\":{},\"block\":{},\"grid_id\":{},\"launch_id\":{},\"error_ns\":{}}}",
                json_str(&p.text),
                p.sm,
                p.block,
                p.grid,
                r.launch_id,
                p.error_ns + u64::from(r.run.error_ns)
            );
            let name: String = p.text.trim_end().chars().take(PRINT_NAME_CHARS).collect();
            w.instant(gpid, r.track, "printk", &name, at, Some(&args))?;
        }

        let gpu_meta: Vec<String> = gpus
            .iter()
            .map(|(ordinal, g)| {
                format!(
                    "{{\"ordinal\":{ordinal},\"name\":{},\"trace_pid\":{},\
                     \"clock_offset_ns\":{},\"clock_error_ns\":{}}}",
                    json_str(&g.name),
                    GPU_PID_BASE + *ordinal as u64,
                    g.clock_offset_ns
                        .map_or("null".to_string(), |v| v.to_string()),
                    g.clock_error_ns
                        .map_or("null".to_string(), |v| v.to_string())
                )
            })
            .collect();
        let metadata = format!(
            "{{\"clock\":\"CLOCK_MONOTONIC\",\"ts_unit\":\"microseconds, to the nanosecond\",\
             \"pid\":{pid},\"gpus\":[{}],\"launch_time_error_ns\":{max_launch_error},\
             \"launches\":{},\"kernels\":{},\"gpu_lines\":{},\"gpu_lines_unplaced\":{},\
             \"dropped_events\":{},\"writer\":\"bpftime {}\"}}",
            gpu_meta.join(","),
            summary.launches,
            summary.kernels,
            summary.gpu_lines,
            summary.gpu_lines_unplaced,
            summary.dropped,
            env!("CARGO_PKG_VERSION")
        );
        w.finish(&metadata)?;
        Ok(summary)
    }
}

impl Observer for Timeline {
    fn api_call(&self, call: &ApiCall) {
        Timeline::api_call(self, call);
    }

    fn gpu_print(&self, print: &GpuPrint) {
        Timeline::gpu_print(self, print);
    }
}

/// A function's name for a track: `symbol` (as an ELF symbol table writes it, mangled or
/// not) demangled, and `+0xN` when the probe is `offset` bytes into it.
pub fn function_name(symbol: &str, offset: u64) -> String {
    let name = format!("{:#}", backtrace::SymbolName::new(symbol.as_bytes()));
    if offset == 0 {
        name
    } else {
        format!("{name}+{offset:#x}")
    }
}

/// The name of the code at `addr` (a runtime address in this process) for a track, when
/// the binary's own symbols could not be read: the exported symbol covering it (with
/// `+0xN` inside it), or the object and address.
pub fn symbol_at(addr: usize) -> String {
    // dladdr takes return addresses (it looks one byte back): ask it about addr + 1.
    let (object, exported) = crate::containing_object(addr + 1);
    let start = exported.as_ref().and_then(|sym| {
        let name = std::ffi::CString::new(sym.as_str()).ok()?;
        // SAFETY: dlsym with a NUL-terminated name, in the global scope.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
        (p != 0 && p <= addr).then_some(p)
    });
    match (exported, start) {
        (Some(sym), Some(start)) => function_name(&sym, (addr - start) as u64),
        (Some(sym), None) => function_name(&sym, 0),
        (None, _) => format!("{}:{addr:#x}", object.rsplit('/').next().unwrap_or("?")),
    }
}

/// A launch's kernel span with where it is drawn: the track of its stream, and the
/// number of blocks its grid has.
#[derive(Clone, Copy)]
struct TrackedRun {
    run: KernelRun,
    launch_id: u64,
    track: u64,
    blocks: u64,
}

impl TrackedRun {
    /// Whether a line written at `at` (± `error_ns`) falls in this kernel's span, within
    /// both bounds.
    fn holds(&self, at: u64, error_ns: u64) -> bool {
        let slack = error_ns + u64::from(self.run.error_ns);
        at.saturating_add(slack) >= self.run.start && at <= self.run.end.saturating_add(slack)
    }
}

/// Runs searched back from a line's time for one whose span holds it: a long kernel may
/// have started well before shorter ones that began and ended since.
const RUNS_SEARCHED: usize = 256;

/// The launch that wrote each line (`None`: no calibrated time, or no launch found).
///
/// Time alone cannot tell two kernels running at once apart, so lines go by grid: all the
/// lines of one `%gridid` on a device came from one launch, and the driver numbers
/// launches in the order they were submitted, as launch ids are. The grids are taken in
/// that order, each given to a launch not given yet whose span holds its lines: the
/// earliest after the previous grid's that holds all of them, or else the one that holds
/// most. A line of a grid that its launch's span does not hold (past the clock's bound)
/// is left unplaced rather than put elsewhere.
fn place_lines(
    prints: &[GpuPrint],
    runs_by_device: &HashMap<i32, Vec<TrackedRun>>,
) -> Vec<Option<TrackedRun>> {
    let mut placed = vec![None; prints.len()];
    let mut grids: BTreeMap<(i32, u64), Vec<usize>> = BTreeMap::new();
    for (i, p) in prints.iter().enumerate() {
        if p.at_ns.is_some() {
            grids.entry((p.device, p.grid)).or_default().push(i);
        }
    }
    // The widest error bound of a device's runs: how far past a line's time a run that
    // holds it may start.
    let widest_bound: HashMap<i32, u64> = runs_by_device
        .iter()
        .map(|(&d, runs)| {
            (
                d,
                runs.iter()
                    .map(|r| u64::from(r.run.error_ns))
                    .max()
                    .unwrap_or(0),
            )
        })
        .collect();
    let mut taken: std::collections::HashSet<u64> = std::collections::HashSet::new();
    let mut previous: HashMap<i32, u64> = HashMap::new();
    for ((device, _), lines) in grids {
        let Some(runs) = runs_by_device.get(&device) else {
            continue;
        };
        let at = |i: usize| prints[i].at_ns.unwrap_or(0);
        let highest_block = lines.iter().map(|&i| prints[i].block).max().unwrap_or(0);
        // Candidates: the runs holding at least one of the grid's lines, with how many.
        let mut held: BTreeMap<u64, (usize, TrackedRun)> = BTreeMap::new();
        for &i in &lines {
            let latest_start = at(i) + prints[i].error_ns + widest_bound[&device];
            let after = runs.partition_point(|r| r.run.start <= latest_start);
            for r in runs[..after].iter().rev().take(RUNS_SEARCHED) {
                if r.holds(at(i), prints[i].error_ns)
                    && u64::from(highest_block) < r.blocks.max(1)
                    && !taken.contains(&r.launch_id)
                {
                    held.entry(r.launch_id).or_insert((0, *r)).0 += 1;
                }
            }
        }
        let after_previous = previous.get(&device).copied().unwrap_or(0);
        let choose = |from: &mut dyn Iterator<Item = (&u64, &(usize, TrackedRun))>| {
            let mut best: Option<(usize, TrackedRun)> = None;
            for (_, &(n, r)) in from {
                if n == lines.len() {
                    return Some(r);
                }
                if best.is_none_or(|(m, _)| n > m) {
                    best = Some((n, r));
                }
            }
            best.map(|(_, r)| r)
        };
        let chosen =
            choose(&mut held.range(after_previous + 1..)).or_else(|| choose(&mut held.iter()));
        let Some(run) = chosen else { continue };
        taken.insert(run.launch_id);
        previous.insert(device, run.launch_id);
        for &i in &lines {
            if run.holds(at(i), prints[i].error_ns) {
                placed[i] = Some(run);
            }
        }
    }
    placed
}

/// A kernel's name in the trace: demangled, without parameters.
fn kernel_name(mangled: &str) -> String {
    names::kernel_names(mangled)
        .last()
        .cloned()
        .unwrap_or_else(|| mangled.to_string())
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `ns` as the format's microseconds, to the nanosecond.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// Writes events one per line into `{"traceEvents":[...],...}`.
struct Writer<'a, W: std::io::Write> {
    out: &'a mut W,
    first: bool,
}

impl<'a, W: std::io::Write> Writer<'a, W> {
    fn new(out: &'a mut W) -> Self {
        Writer { out, first: true }
    }

    fn event(&mut self, body: &str) -> std::io::Result<()> {
        let sep = if self.first {
            "{\"traceEvents\":[\n"
        } else {
            ",\n"
        };
        self.first = false;
        self.out.write_all(sep.as_bytes())?;
        self.out.write_all(body.as_bytes())
    }

    fn meta(&mut self, pid: u64, tid: u64, what: &str, name: &str) -> std::io::Result<()> {
        self.event(&format!(
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"{what}\",\"args\":{{\"name\":{}}}}}",
            json_str(name)
        ))
    }

    fn sort_index(&mut self, pid: u64, index: i64) -> std::io::Result<()> {
        self.event(&format!(
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{index}}}}}"
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn span(
        &mut self,
        pid: u64,
        tid: u64,
        cat: &str,
        name: &str,
        begin: u64,
        end: u64,
        args: Option<&str>,
    ) -> std::io::Result<()> {
        let args = args.map_or(String::new(), |a| format!(",\"args\":{a}"));
        self.event(&format!(
            "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"dur\":{},\"cat\":\"{cat}\",\"name\":{}{args}}}",
            micros(begin),
            micros(end.saturating_sub(begin)),
            json_str(name)
        ))
    }

    fn instant(
        &mut self,
        pid: u64,
        tid: u64,
        cat: &str,
        name: &str,
        at: u64,
        args: Option<&str>,
    ) -> std::io::Result<()> {
        let args = args.map_or(String::new(), |a| format!(",\"args\":{a}"));
        // "I": the older spelling of an instant, which every reader takes ("i" is not
        // read by all).
        self.event(&format!(
            "{{\"ph\":\"I\",\"s\":\"t\",\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"cat\":\"{cat}\",\"name\":{}{args}}}",
            micros(at),
            json_str(name)
        ))
    }

    /// A flow's start (`s`) or end (`f`), bound to the launch-category span that starts
    /// at `at` on that thread (readers bind by timestamp, thread and category).
    fn flow(&mut self, ph: &str, pid: u64, tid: u64, at: u64, id: u64) -> std::io::Result<()> {
        let bp = if ph == "f" { ",\"bp\":\"e\"" } else { "" };
        self.event(&format!(
            "{{\"ph\":\"{ph}\"{bp},\"pid\":{pid},\"tid\":{tid},\"ts\":{},\"cat\":\"launch\",\"name\":\"launch\",\"id\":{id}}}",
            micros(at)
        ))
    }

    fn finish(mut self, metadata: &str) -> std::io::Result<()> {
        if self.first {
            self.out.write_all(b"{\"traceEvents\":[")?;
        }
        self.first = false;
        self.out.write_all(
            format!("\n],\"displayTimeUnit\":\"ns\",\"metadata\":{metadata}}}\n").as_bytes(),
        )
    }
}

#[cfg(test)]
mod tests;
