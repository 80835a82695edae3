//! A GPU flame graph: for every launch, the CPU stack of the launch call joined with the
//! launch's GPU time, summed per stack and kernel.
//!
//! [`LaunchStacks::record`] is a launch program's body: at the launch call (on the
//! launching thread) it captures that thread's stack (`bpftime-callstack`: the return
//! addresses and, on a thread running CPython, its Python frames); when the launch
//! completed it adds the GPU time (end minus start) to that stack and kernel. Names are
//! looked up once, when the graph is written, so a launch costs one stack walk.
//!
//! A folded line is `outermost;...;innermost;[gpu] kernel NS`: the frames of the CPU stack
//! from `_start` down to the launch call, each native frame of the Python interpreter's
//! evaluation loop replaced by the Python functions it ran (`forward (model.py:40)`), then
//! the kernel as a leaf frame, weighted by the nanoseconds of GPU time its launches from
//! that stack took.

use crate::pprof::{self, Total};
use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bpftime_callstack::{clean, Capturer, Stack};
use bpftime_gpu_attach::{LaunchContext, PHASE_COMPLETED, PHASE_LAUNCHED};
use bpftime_gpu_ptx::names;
/// Launches kept between their call and their completion. A launch that never completes
/// with GPU times (untimed when too many are in flight, or a failed query) would otherwise
/// stay forever; past this many, the oldest are given up.
const IN_FLIGHT_LIMIT: usize = 1 << 17;

#[derive(Debug, thiserror::Error)]
pub enum FlameGraphError {
    #[error("no launch completed with its GPU times, so there is no flame graph to draw")]
    Empty,
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot draw the flame graph: {0}")]
    Draw(std::io::Error),
}

/// What the graph shows, its title.
const TITLE: &str = "GPU time by the CPU stack that launched it";

/// What [`LaunchStacks::write`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub folded: PathBuf,
    pub svg: PathBuf,
    /// The same as a gzipped pprof profile (`go tool pprof`, Pyroscope, Parca).
    pub pprof: PathBuf,
    /// Distinct (stack, kernel) lines.
    pub lines: usize,
    pub launches: u64,
    pub gpu_ns: u64,
}

#[derive(Default)]
struct Recorded {
    /// Distinct stacks.
    stacks: Vec<Stack>,
    stack_ids: HashMap<Stack, u32>,
    kernels: HashSet<Arc<str>>,
    /// Launches between their call and their completion: their stack.
    in_flight: HashMap<u64, u32>,
    totals: HashMap<(u32, Arc<str>), Total>,
    /// Launches whose GPU times never came.
    given_up: u64,
}

/// The stacks that launched kernels and the GPU time each launch took.
pub struct LaunchStacks {
    /// Objects (path substrings) whose frames at the top of a stack are the interception's,
    /// not the application's: they are left out of the graph.
    interception: Vec<String>,
    capturer: Capturer,
    recorded: Mutex<Recorded>,
}

impl LaunchStacks {
    /// `interception` names the objects whose innermost frames are left out (the agent's
    /// own library, the CUDA driver).
    pub fn new(interception: Vec<String>) -> Self {
        LaunchStacks {
            interception,
            capturer: Capturer::new(),
            recorded: Mutex::new(Recorded::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A launch program's run on `ctx` for `kernel` (its whole mangled name).
    pub fn record(&self, ctx: &LaunchContext, kernel: &str) {
        match ctx.phase {
            PHASE_LAUNCHED if ctx.result == 0 => {
                let stack = self.capturer.capture();
                let mut r = self.lock();
                let id = match r.stack_ids.get(&stack) {
                    Some(&id) => id,
                    None => {
                        let id = r.stacks.len() as u32;
                        r.stacks.push(stack.clone());
                        r.stack_ids.insert(stack, id);
                        id
                    }
                };
                if r.in_flight.len() >= IN_FLIGHT_LIMIT {
                    let keep_from = ctx.launch_id.saturating_sub(IN_FLIGHT_LIMIT as u64 / 2);
                    let before = r.in_flight.len();
                    r.in_flight.retain(|&launch, _| launch >= keep_from);
                    r.given_up += (before - r.in_flight.len()) as u64;
                }
                r.in_flight.insert(ctx.launch_id, id);
            }
            PHASE_COMPLETED => {
                let mut r = self.lock();
                let Some(stack) = r.in_flight.remove(&ctx.launch_id) else {
                    return;
                };
                let kernel = match r.kernels.get(kernel) {
                    Some(k) => k.clone(),
                    None => {
                        let k: Arc<str> = kernel.into();
                        r.kernels.insert(k.clone());
                        k
                    }
                };
                let total = r.totals.entry((stack, kernel)).or_default();
                total.launches += 1;
                total.gpu_ns += ctx.gpu_end_ns.saturating_sub(ctx.gpu_start_ns);
            }
            _ => {}
        }
    }

    /// Launches seen at their call whose GPU times have not come (yet).
    pub fn awaiting(&self) -> u64 {
        let r = self.lock();
        r.in_flight.len() as u64 + r.given_up
    }

    /// The folded stacks, sorted, with their launch counts alongside.
    pub fn folded(&self) -> Vec<(String, Total)> {
        let r = self.lock();
        let mut namer = self.capturer.namer();
        let mut merged: HashMap<String, Total> = HashMap::new();
        for ((stack, kernel), total) in &r.totals {
            let mut frames = namer.fold(&r.stacks[*stack as usize], &self.interception);
            frames.push(format!("[gpu] {}", kernel_frame(kernel)));
            // Two stacks can read the same once names are looked up (addresses in one
            // function), so lines merge here.
            let t = merged.entry(frames.join(";")).or_default();
            t.launches += total.launches;
            t.gpu_ns += total.gpu_ns;
        }
        let mut lines: Vec<(String, Total)> = merged.into_iter().collect();
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        lines
    }

    /// Writes `PATH.folded`, `PATH.svg` and `PATH.pb.gz` (`path`'s extension replaced).
    pub fn write(&self, path: &Path) -> Result<Written, FlameGraphError> {
        let lines = self.folded();
        if lines.is_empty() {
            return Err(FlameGraphError::Empty);
        }
        let folded_path = path.with_extension("folded");
        let svg_path = path.with_extension("svg");
        let text: Vec<String> = lines
            .iter()
            .map(|(stack, t)| format!("{stack} {}", t.gpu_ns))
            .collect();
        let mut body = text.join("\n");
        body.push('\n');
        std::fs::write(&folded_path, body).map_err(|source| FlameGraphError::Write {
            path: folded_path.clone(),
            source,
        })?;
        let mut svg = Vec::new();
        let mut options = inferno::flamegraph::Options::default();
        options.title = TITLE.into();
        options.count_name = "ns of GPU time".into();
        inferno::flamegraph::from_lines(&mut options, text.iter().map(String::as_str), &mut svg)
            .map_err(FlameGraphError::Draw)?;
        std::fs::File::create(&svg_path)
            .and_then(|mut f| f.write_all(&svg))
            .map_err(|source| FlameGraphError::Write {
                path: svg_path.clone(),
                source,
            })?;
        let pprof_path = path.with_extension("pb.gz");
        std::fs::write(&pprof_path, pprof::encode(&lines, TITLE)).map_err(|source| {
            FlameGraphError::Write {
                path: pprof_path.clone(),
                source,
            }
        })?;
        Ok(Written {
            folded: folded_path,
            svg: svg_path,
            pprof: pprof_path,
            lines: lines.len(),
            launches: lines.iter().map(|(_, t)| t.launches).sum(),
            gpu_ns: lines.iter().map(|(_, t)| t.gpu_ns).sum(),
        })
    }
}

/// A kernel's frame: its demangled name without parameters (`vectorAdd`,
/// `tiles::matmul<16>`), or the mangled one where it does not demangle.
fn kernel_frame(mangled: &str) -> String {
    let names = names::kernel_names(mangled);
    clean(names.last().map(String::as_str).unwrap_or(mangled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bpftime_gpu_attach::launch::LAUNCH_NAME_BYTES;

    fn context(launch_id: u64, phase: u32, gpu_ns: (u64, u64)) -> LaunchContext {
        LaunchContext {
            launch_id,
            function: 0,
            stream: 0,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            device: 0,
            cpu_ns: 1,
            gpu_start_ns: gpu_ns.0,
            gpu_end_ns: gpu_ns.1,
            clock_error_ns: 0,
            phase,
            result: 0,
            name_len: 0,
            kernel_id: 0,
            name: [0; LAUNCH_NAME_BYTES],
        }
    }

    const KERNEL: &str = "_Z7vec_addPKfS0_Pfi";

    #[inline(never)]
    fn launch_from_path_one(s: &LaunchStacks, id: u64) {
        s.record(&context(id, PHASE_LAUNCHED, (0, 0)), KERNEL);
        std::hint::black_box(());
    }

    #[inline(never)]
    fn launch_from_path_two(s: &LaunchStacks, id: u64) {
        s.record(&context(id, PHASE_LAUNCHED, (0, 0)), KERNEL);
        std::hint::black_box(());
    }

    fn complete(s: &LaunchStacks, id: u64, ns: u64) {
        s.record(&context(id, PHASE_COMPLETED, (1_000, 1_000 + ns)), KERNEL);
    }

    fn line_through<'a>(lines: &'a [(String, Total)], frame: &str) -> &'a (String, Total) {
        let hits: Vec<_> = lines.iter().filter(|(l, _)| l.contains(frame)).collect();
        assert_eq!(hits.len(), 1, "one line through {frame}: {lines:#?}");
        hits[0]
    }

    #[test]
    fn each_call_path_gets_the_gpu_time_of_its_own_launches() {
        let s = LaunchStacks::new(Vec::new());
        for i in 0..10 {
            launch_from_path_one(&s, 2 * i);
            launch_from_path_two(&s, 2 * i + 1);
        }
        for i in 0..10 {
            complete(&s, 2 * i, 100);
            complete(&s, 2 * i + 1, 3_000);
        }
        assert_eq!(s.awaiting(), 0);
        let lines = s.folded();
        let (one, t1) = line_through(&lines, "launch_from_path_one");
        let (two, t2) = line_through(&lines, "launch_from_path_two");
        assert_eq!(
            *t1,
            Total {
                launches: 10,
                gpu_ns: 1_000
            }
        );
        assert_eq!(
            *t2,
            Total {
                launches: 10,
                gpu_ns: 30_000
            }
        );
        for line in [one, two] {
            // The kernel is the leaf, under the function that launched it, under the test.
            assert!(line.ends_with(";[gpu] vec_add"), "{line}");
            let frames: Vec<&str> = line.split(';').collect();
            let caller = frames
                .iter()
                .position(|f| f.contains("launch_from_path_"))
                .unwrap();
            let test = frames
                .iter()
                .position(|f| f.contains("each_call_path_gets"))
                .unwrap();
            assert!(test < caller, "outermost first: {line}");
        }
    }

    #[test]
    fn a_launch_that_failed_or_never_completed_adds_no_time() {
        let s = LaunchStacks::new(Vec::new());
        let mut failed = context(1, PHASE_LAUNCHED, (0, 0));
        failed.result = 1;
        s.record(&failed, KERNEL);
        complete(&s, 1, 500);
        launch_from_path_one(&s, 2);
        assert!(s.folded().is_empty());
        assert_eq!(s.awaiting(), 1);
        assert!(matches!(
            s.write(Path::new("/nonexistent/x")),
            Err(FlameGraphError::Empty)
        ));
    }

    #[test]
    fn the_interception_frames_on_top_are_left_out() {
        let me =
            bpftime_callstack::containing_object(launch_from_path_one as *const () as usize + 1).0;
        assert!(!me.is_empty());
        let s = LaunchStacks::new(vec![me]);
        launch_from_path_one(&s, 1);
        complete(&s, 1, 10);
        let lines = s.folded();
        assert_eq!(lines.len(), 1);
        // Everything in this test binary is "interception" here: what is left starts
        // below it, in libc's thread start, and the kernel leaf follows.
        let line = &lines[0].0;
        assert!(!line.contains("launch_from_path_one"), "{line}");
        assert!(line.ends_with(";[gpu] vec_add"), "{line}");
    }

    #[test]
    fn writes_folded_stacks_and_an_svg() {
        let s = LaunchStacks::new(Vec::new());
        launch_from_path_one(&s, 1);
        complete(&s, 1, 4_242);
        let dir = std::env::temp_dir().join(format!("bpftime-flame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = s.write(&dir.join("graph.svg")).unwrap();
        assert_eq!((w.lines, w.launches, w.gpu_ns), (1, 1, 4_242));
        let folded = std::fs::read_to_string(&w.folded).unwrap();
        assert!(
            folded.trim_end().ends_with(";[gpu] vec_add 4242"),
            "{folded}"
        );
        let svg = std::fs::read_to_string(&w.svg).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("[gpu] vec_add"));
        assert!(svg.contains("launch_from_path_one"));
        assert_eq!(w.pprof, dir.join("graph.pb.gz"));
        // pprof itself reads the profile: the sample's values and its stack, the kernel
        // innermost, the function that launched it further out, this test further still.
        let out = std::process::Command::new("go")
            .args(["tool", "pprof", "-raw"])
            .arg(&w.pprof)
            .env("HOME", &dir)
            .output()
            .expect("go is not installed: run scripts/setup.sh (Debian package golang-go)");
        let raw = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{raw}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            raw.contains("launches/count gpu_time/nanoseconds[dflt]"),
            "{raw}"
        );
        let sample = raw
            .lines()
            .skip_while(|l| !l.starts_with("Samples:"))
            .skip(2)
            .take_while(|l| !l.starts_with("Locations"))
            .collect::<Vec<_>>();
        assert!(
            sample[0].trim_start().starts_with("1       4242: "),
            "{raw}"
        );
        let loc = |id: &str| {
            raw.lines()
                .find_map(|l| {
                    let l = l.trim_start();
                    let rest = l.strip_prefix(&format!("{id}: 0x0 "))?;
                    // pprof gives the profile a mapping of its own (M=1).
                    let rest = rest.strip_prefix("M=1 ").unwrap_or(rest);
                    Some(rest.trim().to_string())
                })
                .unwrap_or_default()
        };
        let ids: Vec<&str> = sample[0]
            .split(':')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(loc(ids[0]), "[gpu] vec_add :0 s=0", "{raw}");
        let at = |name: &str| ids.iter().position(|i| loc(i).contains(name));
        let (launcher, test) = (at("launch_from_path_one"), at("writes_folded_stacks"));
        assert!(
            launcher.is_some() && test.is_some() && launcher < test,
            "innermost first: {raw}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kernel_names_without_their_parameters() {
        assert_eq!(kernel_frame("_Z7vec_addPKfS0_Pfi"), "vec_add");
        assert_eq!(kernel_frame("not_mangled"), "not_mangled");
    }
}
