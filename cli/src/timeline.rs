//! Memory-access timelines: sampled accesses drawn as a PNG with time across, address
//! down and the density of accesses as colour, in the spirit of Neutrino's densified
//! memory access timeline.
//!
//! Buffers far apart in the address space would leave most of the picture empty: the
//! address axis is cut into the ranges the accesses fall in (a gap of more than
//! [`GAP`] bytes starts a new one), each given rows in proportion to its span and
//! separated by a grey line. Density is drawn on a log scale, black where nothing was
//! seen.

use anyhow::{anyhow, Context};
use std::path::Path;

const WIDTH: usize = 1024;
const HEIGHT: usize = 768;
/// A gap in the addresses wider than this separates two ranges.
const GAP: u64 = 64 << 20;
/// Rows between two ranges.
const SEPARATOR: usize = 2;

/// One address range of the picture: `[lo, hi]`, drawn from row `top` over `rows` rows.
struct Band {
    lo: u64,
    hi: u64,
    top: usize,
    rows: usize,
}

fn bands(points: &[(u64, u64)]) -> Vec<Band> {
    let mut addrs: Vec<u64> = points.iter().map(|p| p.1).collect();
    addrs.sort_unstable();
    addrs.dedup();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for a in addrs {
        match ranges.last_mut() {
            Some(r) if a - r.1 <= GAP => r.1 = a,
            _ => ranges.push((a, a)),
        }
    }
    let usable = HEIGHT.saturating_sub(SEPARATOR * ranges.len().saturating_sub(1));
    let min_rows = 8.min(usable / ranges.len().max(1)).max(1);
    let span = |r: &(u64, u64)| (r.1 - r.0 + 1) as f64;
    let total: f64 = ranges.iter().map(span).sum();
    let spare = usable.saturating_sub(min_rows * ranges.len()) as f64;
    let mut top = 0;
    ranges
        .iter()
        .map(|r| {
            let rows = min_rows + (spare * span(r) / total) as usize;
            let band = Band {
                lo: r.0,
                hi: r.1,
                top,
                rows,
            };
            top += rows + SEPARATOR;
            band
        })
        .collect()
}

/// The colour of a density in `[0, 1]`: dark purple through red and orange to pale
/// yellow.
fn colour(x: f64) -> [u8; 3] {
    const STOPS: [(f64, [f64; 3]); 5] = [
        (0.0, [40.0, 0.0, 90.0]),
        (0.3, [150.0, 20.0, 110.0]),
        (0.6, [230.0, 60.0, 30.0]),
        (0.85, [250.0, 170.0, 0.0]),
        (1.0, [255.0, 255.0, 190.0]),
    ];
    let x = x.clamp(0.0, 1.0);
    let i = STOPS.iter().rposition(|s| s.0 <= x).unwrap_or(0).min(3);
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let f = (x - a.0) / (b.0 - a.0);
    std::array::from_fn(|k| (a.1[k] + (b.1[k] - a.1[k]) * f).round() as u8)
}

/// CRC-32 (ISO-HDLC, as PNG chunks carry it) of `bytes`.
fn crc32(bytes: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for b in bytes.iter().flat_map(|b| b.iter()) {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG of 8-bit RGB rows (no filtering, zlib-compressed by miniz_oxide, pure Rust: a
/// zlib with C symbols would clash with the one libbpf links statically).
fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let row = width as usize * 3;
    let mut raw = Vec::with_capacity((row + 1) * height as usize);
    for line in rgb.chunks_exact(row) {
        raw.push(0);
        raw.extend_from_slice(line);
    }
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut chunk = |kind: &[u8; 4], data: &[u8]| {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        png.extend_from_slice(kind);
        png.extend_from_slice(data);
        png.extend_from_slice(&crc32(&[kind, data]).to_be_bytes());
    };
    let mut header = Vec::new();
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(b"IHDR", &header);
    chunk(
        b"IDAT",
        &miniz_oxide::deflate::compress_to_vec_zlib(&raw, 6),
    );
    chunk(b"IEND", &[]);
    png
}

/// Draws `points` (time in ns, address) into a PNG at `path`; returns a line saying
/// what the axes span.
pub fn write_png(points: &[(u64, u64)], path: &Path) -> anyhow::Result<String> {
    if points.is_empty() {
        return Err(anyhow!("no accesses to draw in {}", path.display()));
    }
    let t0 = points.iter().map(|p| p.0).min().unwrap_or(0);
    let t1 = points.iter().map(|p| p.0).max().unwrap_or(0);
    let bands = bands(points);
    let mut counts = vec![0u32; WIDTH * HEIGHT];
    for &(t, a) in points {
        let x = ((t - t0) as u128 * (WIDTH as u128 - 1) / u128::from((t1 - t0).max(1))) as usize;
        let Some(b) = bands.iter().find(|b| (b.lo..=b.hi).contains(&a)) else {
            continue;
        };
        let y = b.top
            + ((a - b.lo) as u128 * (b.rows as u128 - 1) / u128::from((b.hi - b.lo).max(1)))
                as usize;
        if let Some(c) = counts.get_mut(y.min(HEIGHT - 1) * WIDTH + x.min(WIDTH - 1)) {
            *c += 1;
        }
    }
    let max = f64::from(counts.iter().copied().max().unwrap_or(1).max(1));
    let mut rgb = vec![0u8; WIDTH * HEIGHT * 3];
    for (i, &c) in counts.iter().enumerate() {
        if c > 0 {
            let level = (1.0 + f64::from(c)).ln() / (1.0 + max).ln();
            rgb[i * 3..i * 3 + 3].copy_from_slice(&colour(level));
        }
    }
    for b in bands.iter().skip(1) {
        for y in b.top.saturating_sub(SEPARATOR)..b.top {
            for x in 0..WIDTH {
                rgb[(y * WIDTH + x) * 3..(y * WIDTH + x) * 3 + 3].copy_from_slice(&[90, 90, 90]);
            }
        }
    }
    std::fs::write(path, encode_png(WIDTH as u32, HEIGHT as u32, &rgb))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let ranges: Vec<String> = bands
        .iter()
        .map(|b| {
            format!(
                "{:#x}..{:#x} ({:.1} MiB)",
                b.lo,
                b.hi,
                (b.hi - b.lo) as f64 / (1 << 20) as f64
            )
        })
        .collect();
    Ok(format!(
        "{} sampled accesses over {:.3} ms across, addresses down in {} range(s): {}",
        points.len(),
        (t1 - t0) as f64 / 1e6,
        bands.len(),
        ranges.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_apart_buffers_get_bands_of_their_own() {
        let mib = 1u64 << 20;
        let mut points = Vec::new();
        for i in 0..100u64 {
            points.push((i, 0x7000_0000_0000 + i * mib));
            points.push((i, 0x7100_0000_0000 + i * mib / 4));
        }
        let b = bands(&points);
        assert_eq!(b.len(), 2);
        assert_eq!(
            (b[0].lo, b[0].hi),
            (0x7000_0000_0000, 0x7000_0000_0000 + 99 * mib)
        );
        // Rows in proportion to span: the second range spans a quarter of the first.
        assert!(
            b[0].rows > 3 * b[1].rows && b[0].rows < 5 * b[1].rows,
            "{} {}",
            b[0].rows,
            b[1].rows
        );
        assert_eq!(b[1].top, b[0].rows + SEPARATOR);
        assert!(b[1].top + b[1].rows <= HEIGHT);
    }

    #[test]
    fn a_sweep_draws_a_diagonal_png() {
        let points: Vec<(u64, u64)> = (0..10_000u64)
            .map(|i| (i * 100, 0x1000 + i * 128))
            .collect();
        let dir = std::env::temp_dir().join(format!("bpftime-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.png");
        let summary = write_png(&points, &path).unwrap();
        assert!(
            summary.starts_with("10000 sampled accesses over 1.000 ms"),
            "{summary}"
        );
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(&png[12..16], b"IHDR");
        assert_eq!(
            u32::from_be_bytes(png[16..20].try_into().unwrap()),
            WIDTH as u32
        );
        assert_eq!(
            u32::from_be_bytes(png[20..24].try_into().unwrap()),
            HEIGHT as u32
        );
        let idat_len = u32::from_be_bytes(png[33..37].try_into().unwrap()) as usize;
        assert_eq!(&png[37..41], b"IDAT");
        let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&png[41..41 + idat_len]).unwrap();
        assert_eq!(raw.len(), (WIDTH * 3 + 1) * HEIGHT);
        let buf: Vec<u8> = raw
            .chunks_exact(WIDTH * 3 + 1)
            .flat_map(|r| r[1..].to_vec())
            .collect();
        let lit = |x: usize, y: usize| buf[(y * WIDTH + x) * 3..][..3] != [0, 0, 0];
        // Early accesses at low addresses, late ones at high: the diagonal is lit, the
        // opposite corners are not.
        assert!(lit(0, 0) && lit(WIDTH - 1, HEIGHT - 1));
        assert!(!lit(WIDTH - 1, 0) && !lit(0, HEIGHT - 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn chunk_checksums_are_crc32() {
        // The CRC of "IEND" with no data, as every PNG ends.
        assert_eq!(crc32(&[b"IEND", b""]), 0xae42_6082);
        assert_eq!(crc32(&[b"123456789"]), 0xcbf4_3926);
    }

    #[test]
    fn no_points_is_an_error_not_an_empty_picture() {
        let e = write_png(&[], Path::new("/nonexistent/x.png")).unwrap_err();
        assert!(e.to_string().contains("no accesses"), "{e}");
    }
}
