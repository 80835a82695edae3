//! `bpftime run --metrics ADDR`: the maps of a tool's object served as Prometheus metrics
//! while the app runs, checked as the text a scrape gets and as a real Prometheus server
//! (Debian's package) stores and answers them, following the app's calls as they happen.

use bpftime_tests::{examples, Session};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TOOL: &str = r#"
#define __TARGET_ARCH_x86
#include <linux/bpf.h>
#include <linux/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct who { __u32 pid; char comm[16]; };
struct stats { __u64 calls; __s64 last_arg; };
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 64);
    __type(key, struct who);
    __type(value, __u64);
} calls SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 4);
    __type(key, __u32);
    __type(value, __u64);
} by_arg_mod4 SEC(".maps");
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct stats);
} stats SEC(".maps");
__u64 total_calls = 0;

SEC("uprobe/work")
int on_work(struct pt_regs *ctx)
{
    struct who w = {};
    __u64 one = 1, *v;
    __u32 k = (__u32)PT_REGS_PARM1(ctx) % 4, z = 0;
    struct stats *s;

    w.pid = bpf_get_current_pid_tgid() >> 32;
    bpf_get_current_comm(w.comm, sizeof(w.comm));
    v = bpf_map_lookup_elem(&calls, &w);
    if (v)
        __sync_fetch_and_add(v, 1);
    else
        bpf_map_update_elem(&calls, &w, &one, BPF_ANY);
    v = bpf_map_lookup_elem(&by_arg_mod4, &k);
    if (v)
        *v += 1;
    s = bpf_map_lookup_elem(&stats, &z);
    if (s) {
        __sync_fetch_and_add(&s->calls, 1);
        s->last_arg = -(long)PT_REGS_PARM1(ctx);
    }
    __sync_fetch_and_add(&total_calls, 1);
    return 0;
}
char LICENSE[] SEC("license") = "GPL";
"#;

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET path` at 127.0.0.1:`port`, or why not.
fn get(port: u16, path: &str) -> Result<String, String> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut reply = String::new();
    c.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(head.to_string());
    }
    Ok(body.to_string())
}

/// The app under `bpftime run --metrics`, fed batches through stdin.
struct Run {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Run {
    fn batch(&mut self, n: u64, total: u64) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{n}").unwrap();
        let want = format!("done total={total}");
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l == want => return,
                Ok(_) => {}
                Err(_) => panic!("the app never printed `{want}`"),
            }
        }
    }
}

/// Prometheus on `port`, scraping 127.0.0.1:`target` every second.
struct Prometheus(Child);

impl Prometheus {
    fn start(s: &Session, port: u16, target: u16) -> Prometheus {
        let config = s.tmp.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: bpftime\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                s.tmp.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "prometheus is not installed: run scripts/setup.sh (Debian package prometheus)",
            );
        let p = Prometheus(child);
        let end = Instant::now() + Duration::from_secs(60);
        while get(port, "/-/ready").is_err() {
            assert!(Instant::now() < end, "prometheus never became ready");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until Prometheus answers `query` with one sample of `value`; returns its labels.
fn wait_for_sample(port: u16, query: &str, value: &str) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < end {
        if let Ok(body) = get(port, &format!("/api/v1/query?query={query}")) {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if let Some([one]) = v["data"]["result"].as_array().map(Vec::as_slice) {
                if one["value"][1] == value {
                    return one["metric"].clone();
                }
            }
            last = body;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("prometheus never answered {query} with {value}; last answer: {last}");
}

#[test]
fn run_serves_maps_as_prometheus_metrics_that_prometheus_scrapes() {
    let s = Session::new("metrics");
    let obj = s.compile_bpf("metrics", TOOL);
    let port = free_port();
    let mut c = s.bpftime();
    c.arg("run")
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .arg(&obj)
        .arg("--")
        .arg(examples::TICKER)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("bpftime run");
    let out = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut run = Run { child, lines };
    run.batch(10, 10);

    // The text a scrape gets: every family typed and described, the key's members as
    // labels, per-CPU values summed, a struct value's members as families of their own.
    let text = get(port, "/metrics").expect("scrape");
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let by_comm = samples
        .iter()
        .find(|l| l.starts_with("bpftime_calls{pid=\""))
        .unwrap_or_else(|| panic!("no calls sample: {text}"));
    assert!(by_comm.ends_with("\",comm=\"ticker\"} 10"), "{text}");
    for want in [
        "bpftime_by_arg_mod4{key=\"0\"} 3",
        "bpftime_by_arg_mod4{key=\"1\"} 3",
        "bpftime_by_arg_mod4{key=\"2\"} 2",
        "bpftime_by_arg_mod4{key=\"3\"} 2",
        "bpftime_global_total_calls 10",
        "bpftime_stats_calls{key=\"0\"} 10",
        "bpftime_stats_last_arg{key=\"0\"} -9",
    ] {
        assert!(samples.contains(&want), "no `{want}` in:\n{text}");
    }
    assert!(
        text.contains("# TYPE bpftime_calls untyped\n")
            && text.contains("# HELP bpftime_calls map calls (hash, struct who -> __u64)\n"),
        "{text}"
    );
    assert_eq!(
        get(port, "/other")
            .err()
            .map(|e| e.starts_with("HTTP/1.1 404")),
        Some(true)
    );

    // A real Prometheus scrapes it, and follows the maps as the app goes on.
    let prom_port = free_port();
    let _prometheus = Prometheus::start(&s, prom_port, port);
    let labels = wait_for_sample(prom_port, "bpftime_calls", "10");
    assert_eq!(labels["comm"], "ticker", "{labels}");
    assert_eq!(labels["job"], "bpftime", "{labels}");
    wait_for_sample(prom_port, "bpftime_global_total_calls", "10");
    run.batch(5, 15);
    wait_for_sample(prom_port, "bpftime_global_total_calls", "15");
    wait_for_sample(prom_port, "sum(bpftime_by_arg_mod4)", "15");
    wait_for_sample(prom_port, "bpftime_stats_last_arg", "-14");

    drop(run.child.stdin.take());
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = run.child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < end, "bpftime run did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = run.child.stderr.take().unwrap().read_to_string(&mut err);
    assert!(status.success(), "{status}: {err}");
    assert!(
        err.contains(&format!("metrics at http://127.0.0.1:{port}/metrics")),
        "{err}"
    );
}

#[test]
fn metrics_at_an_address_in_use_is_a_usage_error() {
    let s = Session::new("metrics-busy");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut c = s.bpftime();
    c.arg("run")
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .arg(examples::FUNCLATENCY_BPF_O)
        .arg("--")
        .arg(examples::CALLS)
        .arg("1");
    let out = bpftime_tests::run_with_timeout(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("--metrics 127.0.0.1:{port}: cannot listen there")),
        "{err}"
    );
}
