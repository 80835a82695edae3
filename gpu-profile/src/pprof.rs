//! The flame graph as a pprof profile (`profile.proto`, gzipped), which `go tool pprof`,
//! Pyroscope and Parca read: one sample per folded line, its locations the line's frames
//! innermost first (the kernel, then the launching call, out to `_start`), its values the
//! launches and the GPU nanoseconds. A Python frame written `func (file.py:40)` becomes
//! function `func` in `file.py` at line 40, so pprof's source views find the line.
//!
//! The encoding is written here (a profile is a few varints and strings): the format is
//! stable, and a protobuf library would be the only user of its dependencies.

use std::collections::HashMap;

/// Protobuf wire types.
const VARINT: u64 = 0;
const LEN: u64 = 2;

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u64, wire: u64) {
    varint(out, field << 3 | wire);
}

fn uint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    if v != 0 {
        key(out, field, VARINT);
        varint(out, v);
    }
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    key(out, field, LEN);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn packed_field(out: &mut Vec<u8>, field: u64, values: &[u64]) {
    let mut body = Vec::new();
    for &v in values {
        varint(&mut body, v);
    }
    bytes_field(out, field, &body);
}

/// The profile's strings, index 0 the empty one as the format requires.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, u64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> u64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.index.insert(String::new(), 0);
        }
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as u64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// A frame's function name, file and line: `func (file:LINE)` as the Python frames are
/// written, anything else a name alone.
fn frame_parts(frame: &str) -> (&str, &str, u64) {
    if let Some(rest) = frame.strip_suffix(')') {
        if let Some((name, place)) = rest.rsplit_once(" (") {
            if let Some((file, line)) = place.rsplit_once(':') {
                if let Ok(line) = line.parse() {
                    return (name, file, line);
                }
            }
        }
    }
    (frame, "", 0)
}

/// GPU time from one stack into one kernel: a sample's values (`launches`, `gpu_time`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Total {
    pub launches: u64,
    pub gpu_ns: u64,
}

/// The gzipped profile of `lines` (folded stacks, outermost frame first, and their totals).
pub fn encode(lines: &[(String, Total)], title: &str) -> Vec<u8> {
    let mut strings = Strings::default();
    let mut profile = Vec::new();
    // sample_type: launches (count), gpu_time (nanoseconds).
    for (kind, unit) in [("launches", "count"), ("gpu_time", "nanoseconds")] {
        let mut vt = Vec::new();
        uint_field(&mut vt, 1, strings.id(kind));
        uint_field(&mut vt, 2, strings.id(unit));
        bytes_field(&mut profile, 1, &vt);
    }
    // One function and one location per distinct frame text (ids from 1).
    let mut frame_ids: HashMap<&str, u64> = HashMap::new();
    let mut frames: Vec<&str> = Vec::new();
    for (stack, total) in lines {
        let mut ids: Vec<u64> = stack
            .split(';')
            .map(|f| {
                *frame_ids.entry(f).or_insert_with(|| {
                    frames.push(f);
                    frames.len() as u64
                })
            })
            .collect();
        // pprof lists a sample's locations innermost first.
        ids.reverse();
        let mut sample = Vec::new();
        packed_field(&mut sample, 1, &ids);
        packed_field(&mut sample, 2, &[total.launches, total.gpu_ns]);
        bytes_field(&mut profile, 2, &sample);
    }
    for (i, frame) in frames.iter().enumerate() {
        let id = i as u64 + 1;
        let (name, file, line) = frame_parts(frame);
        let mut location = Vec::new();
        uint_field(&mut location, 1, id);
        let mut l = Vec::new();
        uint_field(&mut l, 1, id);
        uint_field(&mut l, 2, line);
        bytes_field(&mut location, 4, &l);
        bytes_field(&mut profile, 4, &location);
        let mut function = Vec::new();
        uint_field(&mut function, 1, id);
        uint_field(&mut function, 2, strings.id(name));
        uint_field(&mut function, 3, strings.id(name));
        uint_field(&mut function, 4, strings.id(file));
        uint_field(&mut function, 5, line);
        bytes_field(&mut profile, 5, &function);
    }
    let comment = strings.id(title);
    let default_type = strings.id("gpu_time");
    for s in &strings.table {
        bytes_field(&mut profile, 6, s.as_bytes());
    }
    // comment and default_sample_type.
    packed_field(&mut profile, 13, &[comment]);
    uint_field(&mut profile, 14, default_type);
    gzip(&profile)
}

/// `data` in a gzip member (RFC 1952): what pprof readers expect of a `.pb.gz`.
fn gzip(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.extend(miniz_oxide::deflate::compress_to_vec(data, 6));
    out.extend(crc32(data).to_le_bytes());
    out.extend((data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                crc >> 1 ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_is_the_gzip_one() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn python_frames_give_their_file_and_line() {
        assert_eq!(
            frame_parts("forward (model.py:40)"),
            ("forward", "model.py", 40)
        );
        assert_eq!(
            frame_parts("<module> (/a b/x.py:3)"),
            ("<module>", "/a b/x.py", 3)
        );
        assert_eq!(
            frame_parts("at::native::add (x)"),
            ("at::native::add (x)", "", 0)
        );
        assert_eq!(frame_parts("[gpu] vec_add"), ("[gpu] vec_add", "", 0));
    }

    #[test]
    fn the_profile_inflates_to_its_fields() {
        let lines = vec![(
            "main;f (m.py:2);[gpu] k".to_string(),
            Total {
                launches: 3,
                gpu_ns: 900,
            },
        )];
        let gz = encode(&lines, "t");
        assert_eq!(&gz[..3], &[0x1f, 0x8b, 8]);
        let body = miniz_oxide::inflate::decompress_to_vec(&gz[10..gz.len() - 8]).unwrap();
        let n = body.len() as u32;
        assert_eq!(&gz[gz.len() - 4..], &n.to_le_bytes());
        assert_eq!(&gz[gz.len() - 8..gz.len() - 4], &crc32(&body).to_le_bytes());
        // The sample: locations 3, 2, 1 (innermost first), values 3 and 900.
        let sample = [0x12, 10, 0x0a, 3, 3, 2, 1, 0x12, 3, 3, 0x84, 7];
        assert!(body.windows(sample.len()).any(|w| w == sample), "{body:?}");
    }
}
