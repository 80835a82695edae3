//! `bpftime run --metrics ADDR`: the object's maps as Prometheus metrics, served over HTTP
//! at `/metrics` while the app runs, as ebpf_exporter serves the kernel's, so a fleet
//! scrapes them with the Prometheus it already runs.
//!
//! Each hash or array map (per-CPU ones summed over CPUs) is one metric family,
//! `bpftime_MAP`: one sample per key, the key's struct members as labels (a character
//! array as its string), or one `key` label for a key that is no struct; a value that is a
//! struct gives one family per numeric member, `bpftime_MAP_MEMBER`. Integer variables of
//! the object's data sections (`.bss`, `.data`) are `bpftime_global_NAME`. Values are
//! read from the store at each scrape, so a scrape sees the maps as they are then. The
//! families are `untyped`: a map may count up or hold anything a program wrote.

use crate::show::{self, Types, Value};
use libbpf_rs::{MapCore, MapType, Object};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// The listening socket; scrapes are answered between the run's other work.
pub struct MetricsServer {
    listener: TcpListener,
}

impl MetricsServer {
    /// Listens at `addr` (`HOST:PORT`, or `:PORT` for every address).
    pub fn bind(addr: &str) -> anyhow::Result<MetricsServer> {
        let addr = match addr.strip_prefix(':') {
            Some(port) => format!("0.0.0.0:{port}"),
            None => addr.to_string(),
        };
        let listener = TcpListener::bind(&addr).map_err(|e| {
            anyhow::anyhow!(
                "--metrics {addr}: cannot listen there: {e} (name a free HOST:PORT, or :PORT)"
            )
        })?;
        listener.set_nonblocking(true)?;
        Ok(MetricsServer { listener })
    }

    /// The address it listens at.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Answers every scrape waiting now, with the text `render` makes for each.
    pub fn answer_waiting(&self, render: &mut dyn FnMut() -> String) {
        while let Ok((conn, _)) = self.listener.accept() {
            // A client that went away or sent nothing gets nothing; the run goes on.
            let _ = answer(conn, render);
        }
    }
}

/// One HTTP/1.x request on `conn`: the metrics for `GET /metrics`, 404 for another path,
/// 405 for another method; the connection is closed after the answer.
fn answer(mut conn: TcpStream, render: &mut dyn FnMut() -> String) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    // A client that sends nothing holds the run's loop for at most this long.
    conn.set_read_timeout(Some(Duration::from_millis(500)))?;
    conn.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "bpftime serves /metrics only\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".to_string(),
        ),
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    conn.flush()
}

/// A metric or label name made of what Prometheus allows (`[a-zA-Z_][a-zA-Z0-9_]*`).
fn name(raw: &str) -> String {
    let mut s: String = raw
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// A label value as the text format quotes it.
fn quoted(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The labels of a key: its struct members, or `key`.
fn labels(types: &Types<'_>, key_id: u32, key: &[u8]) -> String {
    let pairs: Vec<(String, String)> = match types.members(key_id, key) {
        Some(members) if !members.is_empty() => members
            .into_iter()
            .map(|(n, ty, b)| (name(&n), types.label_text(ty, b)))
            .collect(),
        _ => vec![("key".into(), types.label_text(key_id, key))],
    };
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", quoted(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// Families by metric name: help text and samples.
type Families = BTreeMap<String, (String, Vec<String>)>;

fn sample(families: &mut Families, metric: String, help: &str, labels: &str, v: f64) {
    families
        .entry(metric)
        .or_insert_with(|| (help.to_string(), Vec::new()))
        .1
        .push(format!("{labels} {}", number(v)));
}

/// The exposition of `obj`'s maps as they are in `store` now.
pub fn exposition(obj: &Object, store: &bpftime_runtime::Store, types: &Types<'_>) -> String {
    let mut families = Families::new();
    let mut notes = Vec::new();
    for map in obj.maps() {
        let map_name = map.name().to_string_lossy().into_owned();
        let (key_id, value_id) = show::btf_ids(&map);
        let kind = show::served_type(&map);
        if types.is_datasec(value_id) {
            if map_name.ends_with(".bss") || map_name.ends_with(".data") {
                let Ok(Some(bytes)) = map.lookup(&0u32.to_ne_bytes(), libbpf_rs::MapFlags::ANY)
                else {
                    continue;
                };
                for (var, ty, b) in types.datasec_numbers(value_id, &bytes) {
                    if let Some(v) = types.as_number(ty, b) {
                        let help = format!("global variable {var} of the object ({map_name})");
                        sample(
                            &mut families,
                            name(&format!("bpftime_global_{var}")),
                            &help,
                            "",
                            v,
                        );
                    }
                }
            }
            continue;
        }
        let exported = matches!(
            kind,
            MapType::Hash
                | MapType::Array
                | MapType::PercpuHash
                | MapType::PercpuArray
                | MapType::LruHash
                | MapType::LruPercpuHash
        );
        if !exported {
            continue;
        }
        let keys = match show::keys_to_print(&map, store) {
            Ok(k) => k,
            Err(e) => {
                notes.push(format!("# bpftime: map {map_name} not read: {e}"));
                continue;
            }
        };
        let metric = name(&format!("bpftime_{map_name}"));
        let help = format!(
            "map {map_name} ({}, {} -> {})",
            show::kind_name(kind),
            types.describe(key_id, map.key_size()),
            types.describe(value_id, map.value_size())
        );
        for (key, value) in show::entries(&map, keys, types, value_id) {
            let labels = labels(types, key_id, &key);
            match &value {
                Value::Number(n) => {
                    sample(&mut families, metric.clone(), &help, &labels, *n as f64)
                }
                Value::Bytes(b) => {
                    if let Some(v) = types.as_number(value_id, b) {
                        sample(&mut families, metric.clone(), &help, &labels, v);
                    } else if let Some(members) = types.members(value_id, b) {
                        for (member, ty, mb) in members {
                            if let Some(v) = types.as_number(ty, mb) {
                                let m = name(&format!("bpftime_{map_name}_{member}"));
                                let h = format!("member {member} of the values of {help}");
                                sample(&mut families, m, &h, &labels, v);
                            }
                        }
                    }
                }
                Value::PerCpu(_) => {}
            }
        }
    }
    let mut out = String::new();
    for note in notes {
        let _ = writeln!(out, "{note}");
    }
    for (metric, (help, samples)) in families {
        let _ = writeln!(
            out,
            "# HELP {metric} {}",
            help.replace('\\', "\\\\").replace('\n', "\\n")
        );
        let _ = writeln!(out, "# TYPE {metric} untyped");
        for s in samples {
            let _ = writeln!(out, "{metric}{s}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_label_values_are_what_the_text_format_allows() {
        assert_eq!(name("counts"), "counts");
        assert_eq!(name("my-map.bss"), "my_map_bss");
        assert_eq!(name("9lives"), "_9lives");
        assert_eq!(quoted("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
        assert_eq!(number(12.0), "12");
        assert_eq!(number(-3.0), "-3");
        assert_eq!(number(0.5), "0.5");
    }

    #[test]
    fn a_scrape_gets_the_rendered_text_and_other_paths_get_404() {
        let server = MetricsServer::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let fetch = |path: &'static str| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(addr).unwrap();
                write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
                let mut s = String::new();
                c.read_to_string(&mut s).unwrap();
                s
            })
        };
        let mut render = || "bpftime_x 1\n".to_string();
        for (path, status, body) in [
            ("/metrics", "200 OK", "bpftime_x 1\n"),
            ("/other", "404 Not Found", "bpftime serves /metrics only\n"),
        ] {
            let client = fetch(path);
            while !client.is_finished() {
                server.answer_waiting(&mut render);
                std::thread::sleep(Duration::from_millis(5));
            }
            let reply = client.join().unwrap();
            assert!(
                reply.starts_with(&format!("HTTP/1.1 {status}\r\n")),
                "{reply}"
            );
            assert!(reply.ends_with(&format!("\r\n\r\n{body}")), "{reply}");
        }
    }
}
