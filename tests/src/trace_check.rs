//! Checks of a `--trace` file that need no trace reader of ours: read as plain JSON, the
//! properties a user relies on when reading a CPU and GPU timeline. Used by the tests here
//! and, through `bpftime-trace-check`, on the GPU machine (which has no Node for the
//! consumer the tests use).

use serde_json::Value;
use std::collections::HashMap;

/// Trace process ids at and above this are GPUs (`bpftime_gpu_profile::timeline`).
pub const GPU_PID_BASE: u64 = 1 << 30;

/// What [`check`] found; `problems` empty when every property holds.
#[derive(Debug, Default)]
pub struct Report {
    pub launches: usize,
    pub kernels: usize,
    /// Launches joined by one flow to exactly one kernel span.
    pub joined: usize,
    pub gpu_lines: usize,
    /// GPU lines inside their kernel's span, within the bound the trace reports.
    pub gpu_lines_inside: usize,
    /// Spans on CPU threads per name.
    pub cpu_spans: HashMap<String, usize>,
    /// Each GPU line's launch and text.
    pub line_launches: Vec<(u64, String)>,
    /// The launches' ids, in order.
    pub launch_ids: Vec<u64>,
    /// The largest bound on a kernel time the trace reports (ns).
    pub bound_ns: u64,
    /// How far a kernel started before its launch call, at most (ns; negative: after).
    pub worst_early_ns: i64,
    pub problems: Vec<String>,
}

/// Nanoseconds from a `ts` or `dur` written as microseconds with three decimals.
pub fn ns(v: &Value) -> Option<u64> {
    let s = v.to_string();
    let (us, frac) = s.split_once('.').unwrap_or((&s, ""));
    let frac = format!("{frac:0<3}");
    Some(us.parse::<u64>().ok()? * 1000 + frac.get(..3)?.parse::<u64>().ok()?)
}

struct Span {
    pid: u64,
    tid: u64,
    begin: u64,
    end: u64,
    launch_id: Option<u64>,
}

fn span(e: &Value) -> Option<Span> {
    let begin = ns(&e["ts"])?;
    Some(Span {
        pid: e["pid"].as_u64()?,
        tid: e["tid"].as_u64()?,
        begin,
        end: begin + ns(&e["dur"])?,
        launch_id: e["args"]["launch_id"].as_u64(),
    })
}

impl Report {
    /// For programs whose K-th launch (0-based, in launch order) writes lines that say
    /// `tag=K`: how many lines say a tag, and each one placed on another launch.
    pub fn misplaced_tags(&self) -> (usize, Vec<String>) {
        let mut tagged = 0;
        let mut problems = Vec::new();
        for (id, text) in &self.line_launches {
            let Some(tag) = text
                .split_once("tag=")
                .and_then(|(_, t)| t.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|t| t.parse::<usize>().ok())
            else {
                continue;
            };
            tagged += 1;
            let wrote = self.launch_ids.get(tag);
            if wrote != Some(id) {
                problems.push(format!(
                    "line {text:?} is on launch {id}, but launch {} wrote it",
                    wrote.map_or("?".to_string(), |w| w.to_string())
                ));
            }
        }
        (tagged, problems)
    }
}

/// Checks `trace`: every launch joined by a flow to exactly one kernel span of the same
/// launch, that flow bound at both ends (same thread, time and category as its span),
/// every GPU line inside its kernel's span, every kernel starting no earlier than its
/// launch call less the reported bound, and no two kernels of one stream overlapping.
pub fn check(trace: &Value) -> Report {
    let mut r = Report::default();
    let Some(events) = trace["traceEvents"].as_array() else {
        r.problems.push("no traceEvents array".into());
        return r;
    };
    let meta = &trace["metadata"];
    if meta["clock"] != "CLOCK_MONOTONIC" {
        r.problems.push(format!(
            "metadata.clock is {}, not CLOCK_MONOTONIC",
            meta["clock"]
        ));
    }
    let gpu_clock_error = meta["gpus"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|g| g["clock_error_ns"].as_u64())
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    r.bound_ns = meta["launch_time_error_ns"].as_u64().unwrap_or(0) + gpu_clock_error;
    r.worst_early_ns = i64::MIN;

    let mut launches: Vec<Span> = Vec::new();
    let mut kernels: Vec<Span> = Vec::new();
    let mut starts: HashMap<u64, Vec<&Value>> = HashMap::new();
    let mut ends: HashMap<u64, Vec<&Value>> = HashMap::new();
    let mut lines: Vec<&Value> = Vec::new();
    for e in events {
        match e["ph"].as_str() {
            Some("X") => {
                let Some(s) = span(e) else {
                    r.problems.push(format!("a span without times: {e}"));
                    continue;
                };
                if s.end < s.begin {
                    r.problems
                        .push(format!("a span that ends before it starts: {e}"));
                }
                if e["cat"] == "launch" {
                    if s.pid >= GPU_PID_BASE {
                        kernels.push(s);
                    } else {
                        launches.push(s);
                    }
                } else if s.pid < GPU_PID_BASE {
                    let name = e["name"].as_str().unwrap_or("?").to_string();
                    *r.cpu_spans.entry(name).or_default() += 1;
                }
            }
            Some("s") => starts
                .entry(e["id"].as_u64().unwrap_or(0))
                .or_default()
                .push(e),
            Some("f") => ends
                .entry(e["id"].as_u64().unwrap_or(0))
                .or_default()
                .push(e),
            Some("I") | Some("i") if e["cat"] == "printk" => lines.push(e),
            _ => {}
        }
    }
    r.launches = launches.len();
    r.launch_ids = launches.iter().filter_map(|l| l.launch_id).collect();
    r.launch_ids.sort_unstable();
    r.kernels = kernels.len();
    r.gpu_lines = lines.len();

    let bound = |s: &Value, span: &Span| {
        ns(&s["ts"]) == Some(span.begin)
            && s["pid"].as_u64() == Some(span.pid)
            && s["tid"].as_u64() == Some(span.tid)
            && s["cat"] == "launch"
    };
    let kernel_of: HashMap<u64, &Span> = kernels
        .iter()
        .filter_map(|k| Some((k.launch_id?, k)))
        .collect();
    if kernel_of.len() != kernels.len() {
        r.problems
            .push("two kernel spans name one launch (or one names none)".into());
    }
    for l in &launches {
        let Some(id) = l.launch_id else {
            r.problems.push("a launch without a launch_id".into());
            continue;
        };
        let Some(k) = kernel_of.get(&id) else {
            r.problems.push(format!(
                "launch {id} has no kernel span (it never completed?)"
            ));
            continue;
        };
        let s = starts.get(&id).map_or(&[][..], Vec::as_slice);
        let f = ends.get(&id).map_or(&[][..], Vec::as_slice);
        if s.len() != 1 || f.len() != 1 {
            r.problems.push(format!(
                "launch {id}: {} flow starts and {} flow ends (one each expected)",
                s.len(),
                f.len()
            ));
            continue;
        }
        if !bound(s[0], l) {
            r.problems.push(format!(
                "launch {id}: its flow start is not at its launch call"
            ));
            continue;
        }
        if !bound(f[0], k) || f[0]["bp"] != "e" {
            r.problems.push(format!(
                "launch {id}: its flow end is not at its kernel's span"
            ));
            continue;
        }
        r.joined += 1;
        let early = l.begin as i64 - k.begin as i64;
        r.worst_early_ns = r.worst_early_ns.max(early);
        if early > r.bound_ns as i64 {
            r.problems.push(format!(
                "launch {id}: its kernel started {early} ns before the launch call, past the \
                 reported bound of {} ns",
                r.bound_ns
            ));
        }
    }
    for id in starts.keys().chain(ends.keys()) {
        if !launches.iter().any(|l| l.launch_id == Some(*id)) {
            r.problems.push(format!("a flow {id} without a launch"));
            break;
        }
    }

    let mut tracks: HashMap<(u64, u64), Vec<&Span>> = HashMap::new();
    for k in &kernels {
        tracks.entry((k.pid, k.tid)).or_default().push(k);
    }
    for ((pid, tid), mut ks) in tracks {
        ks.sort_by_key(|k| k.begin);
        for w in ks.windows(2) {
            if w[1].begin < w[0].end {
                r.problems.push(format!(
                    "GPU {} stream track {tid}: kernel {:?} starts {} ns before kernel {:?} ends",
                    pid - GPU_PID_BASE,
                    w[1].launch_id,
                    w[0].end - w[1].begin,
                    w[0].launch_id
                ));
            }
        }
    }

    for line in &lines {
        let (Some(at), Some(id)) = (ns(&line["ts"]), line["args"]["launch_id"].as_u64()) else {
            r.problems
                .push(format!("a GPU line without a time or launch: {line}"));
            continue;
        };
        let err = line["args"]["error_ns"].as_u64().unwrap_or(0);
        let text = line["args"]["text"].as_str().unwrap_or("").to_string();
        r.line_launches.push((id, text));
        match kernel_of.get(&id) {
            Some(k)
                if line["pid"].as_u64() == Some(k.pid)
                    && line["tid"].as_u64() == Some(k.tid)
                    && at + err >= k.begin
                    && at <= k.end + err =>
            {
                r.gpu_lines_inside += 1
            }
            Some(k) => r.problems.push(format!(
                "GPU line at {at} ns is outside its kernel (launch {id}, {}..{} ns, bound {err} ns)",
                k.begin, k.end
            )),
            None => r
                .problems
                .push(format!("GPU line names launch {id}, which has no kernel span")),
        }
    }
    if meta["gpu_lines_unplaced"].as_u64().unwrap_or(0) > 0 {
        r.problems.push(format!(
            "{} GPU lines could not be placed on a kernel",
            meta["gpu_lines_unplaced"]
        ));
    }
    r
}
