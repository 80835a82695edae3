//! Memory-access timelines: sampled accesses drawn as a PNG with time across, address
//! down and the density of accesses as colour, in the spirit of Neutrino's densified
//! memory access timeline, with the axes, buffer names and colour scale a reader needs.
//!
//! Buffers far apart in the address space would leave most of the picture empty: the
//! address axis is cut into the ranges the accesses fall in (a gap of more than
//! [`GAP`] bytes starts a new one, and so does a change of the kernel pointer argument
//! the accesses fall in, for buffers allocated side by side), each given rows in
//! proportion to its span, separated by a grey line and named by the argument most of
//! its accesses fall in.
//! Density is drawn on a log scale, black where nothing was seen.
//!
//! Text needs a TrueType font; none is linked in (a system font is read at run time:
//! `BPFTIME_FONT`, a DejaVu or Liberation Sans where distributions put them, or what
//! `fc-match` names), and without one the picture is drawn without its words.

use anyhow::{anyhow, Context};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;
use std::sync::OnceLock;

const WIDTH: usize = 1280;
const HEIGHT: usize = 860;
/// The heat map's place in the picture: left of it the buffers' names and offsets,
/// right of it the colour scale, above the title, below the time axis.
const PLOT_LEFT: usize = 250;
const PLOT_TOP: usize = 56;
const PLOT_WIDTH: usize = 900;
const PLOT_HEIGHT: usize = 720;
/// A gap in the addresses wider than this separates two ranges.
const GAP: u64 = 64 << 20;
/// At most this many more ranges than the gaps make, for changes of argument.
const MAX_SPLITS_BY_ARGUMENT: usize = 8;
/// Rows between two ranges.
const SEPARATOR: usize = 2;
/// The font family name plotters knows our font by.
const FAMILY: &str = "sans-serif";
/// Where a sans font lives on common distributions (Debian and Ubuntu, Fedora, Arch).
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];

/// One sampled access: when (ns), where, and the kernel pointer argument it falls in
/// (`None` where the record does not say).
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub time_ns: u64,
    pub addr: u64,
    pub arg: Option<u64>,
}

/// One address range of the picture: `[lo, hi]`, drawn from row `top` (of the heat
/// map) over `rows` rows.
struct Band {
    lo: u64,
    hi: u64,
    top: usize,
    rows: usize,
}

/// Splits the sampled addresses into ranges: at a gap wider than [`GAP`], and where the
/// kernel argument the accesses fall in changes (buffers allocated next to each other
/// get a range, a name and offsets of their own), unless that would make more than
/// [`MAX_SPLITS_BY_ARGUMENT`] extra ranges (arguments aliasing one buffer, interleaved).
fn bands(points: impl Iterator<Item = (u64, Option<u64>)>, height: usize) -> Vec<Band> {
    let mut points: Vec<(u64, Option<u64>)> = points.collect();
    points.sort_unstable_by_key(|p| p.0);
    points.dedup_by_key(|p| p.0);
    let split = |by_argument: bool| {
        // (lo, hi, the argument of the range's accesses so far)
        let mut ranges: Vec<(u64, u64, Option<u64>)> = Vec::new();
        for &(a, arg) in &points {
            match ranges.last_mut() {
                Some(r)
                    if a - r.1 <= GAP
                        && !(by_argument && arg.is_some() && r.2.is_some() && arg != r.2) =>
                {
                    r.1 = a;
                    r.2 = r.2.or(arg);
                }
                _ => ranges.push((a, a, arg)),
            }
        }
        ranges
            .into_iter()
            .map(|(lo, hi, _)| (lo, hi))
            .collect::<Vec<_>>()
    };
    let by_gap = split(false);
    let by_argument = split(true);
    let ranges = if by_argument.len() <= by_gap.len() + MAX_SPLITS_BY_ARGUMENT {
        by_argument
    } else {
        by_gap
    };
    let usable = height.saturating_sub(SEPARATOR * ranges.len().saturating_sub(1));
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

/// Registers the first readable font with plotters, once; whether there is one.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let named = std::env::var_os("BPFTIME_FONT").map(std::path::PathBuf::from);
        // Where fontconfig is installed it knows the system's fonts wherever they are.
        let matched = std::process::Command::new("fc-match")
            .args(["-f", "%{file}", "sans-serif"])
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success() && !o.stdout.is_empty())
            .map(|o| std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).into_owned()));
        let candidates = named
            .into_iter()
            .chain(FONT_PATHS.iter().map(std::path::PathBuf::from))
            .chain(matched);
        for path in candidates {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // plotters keeps fonts for the process's life.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font(FAMILY, FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
        false
    })
}

/// A step of 1, 2 or 5 times a power of ten that cuts `span` into about `n` parts.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// A byte count as people read it.
fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// The name of the buffer a band holds: the kernel argument most of its accesses fall
/// in, or its address where the records do not say.
fn band_name(band: &Band, points: &[Sample]) -> String {
    let mut votes = [0usize; 8];
    for p in points
        .iter()
        .filter(|p| (band.lo..=band.hi).contains(&p.addr))
    {
        if let Some(a) = p.arg {
            votes[a.min(7) as usize] += 1;
        }
    }
    let (best, n) = votes
        .iter()
        .enumerate()
        .max_by_key(|(_, n)| **n)
        .unwrap_or((7, &0));
    if *n == 0 {
        "buffer".to_string()
    } else if best < 6 {
        format!("argument {best}")
    } else {
        "no argument".to_string()
    }
}

/// Draws `points` into a PNG at `path`, titled after `name` (the records' map); returns
/// a line saying what the axes span.
pub fn write_png(points: &[Sample], name: &str, path: &Path) -> anyhow::Result<String> {
    if points.is_empty() {
        return Err(anyhow!("no accesses to draw in {}", path.display()));
    }
    let t0 = points.iter().map(|p| p.time_ns).min().unwrap_or(0);
    let t1 = points.iter().map(|p| p.time_ns).max().unwrap_or(0);
    let bands = bands(points.iter().map(|p| (p.addr, p.arg)), PLOT_HEIGHT);
    let mut counts = vec![0u32; PLOT_WIDTH * PLOT_HEIGHT];
    for p in points {
        let x = ((p.time_ns - t0) as u128 * (PLOT_WIDTH as u128 - 1) / u128::from((t1 - t0).max(1)))
            as usize;
        let Some(b) = bands.iter().find(|b| (b.lo..=b.hi).contains(&p.addr)) else {
            continue;
        };
        let y = b.top
            + ((p.addr - b.lo) as u128 * (b.rows as u128 - 1) / u128::from((b.hi - b.lo).max(1)))
                as usize;
        if y < PLOT_HEIGHT {
            counts[y * PLOT_WIDTH + x] = counts[y * PLOT_WIDTH + x].saturating_add(1);
        }
    }
    let max = f64::from(counts.iter().copied().max().unwrap_or(1).max(1));
    let level = |c: f64| (1.0 + c).ln() / (1.0 + max).ln();

    let mut rgb = vec![255u8; WIDTH * HEIGHT * 3];
    let text = font_ready();
    draw_frame(&mut rgb, &bands, points, name, (t0, t1), max, text)
        .map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))?;
    // The heat map goes in pixel by pixel: a rectangle per cell through plotters would
    // be 650,000 of them.
    for y in 0..PLOT_HEIGHT {
        for x in 0..PLOT_WIDTH {
            let c = counts[y * PLOT_WIDTH + x];
            let px = if c == 0 {
                [0, 0, 0]
            } else {
                colour(level(f64::from(c)))
            };
            let at = ((PLOT_TOP + y) * WIDTH + PLOT_LEFT + x) * 3;
            rgb[at..at + 3].copy_from_slice(&px);
        }
    }
    for b in bands.iter().skip(1) {
        for y in b.top.saturating_sub(SEPARATOR)..b.top {
            for x in 0..PLOT_WIDTH {
                let at = ((PLOT_TOP + y) * WIDTH + PLOT_LEFT + x) * 3;
                rgb[at..at + 3].copy_from_slice(&[110, 110, 110]);
            }
        }
    }
    std::fs::write(path, encode_png(WIDTH as u32, HEIGHT as u32, &rgb))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let ranges: Vec<String> = bands
        .iter()
        .map(|b| {
            format!(
                "{} {:#x}..{:#x} ({})",
                band_name(b, points),
                b.lo,
                b.hi,
                bytes(b.hi - b.lo)
            )
        })
        .collect();
    Ok(format!(
        "{} sampled accesses over {:.3} ms across, addresses down in {} range(s): {}{}",
        points.len(),
        (t1 - t0) as f64 / 1e6,
        bands.len(),
        ranges.join(", "),
        if text {
            ""
        } else {
            "; no font found, so the picture has no words (BPFTIME_FONT=FILE.ttf names one)"
        }
    ))
}

/// The title, the buffers' names and offsets, the time axis and the colour scale.
fn draw_frame(
    rgb: &mut [u8],
    bands: &[Band],
    points: &[Sample],
    name: &str,
    (t0, t1): (u64, u64),
    max: f64,
    text: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::with_buffer(rgb, (WIDTH as u32, HEIGHT as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, top) = (PLOT_LEFT as i32, PLOT_TOP as i32);
    let (right, bottom) = (left + PLOT_WIDTH as i32, top + PLOT_HEIGHT as i32);
    let axis = BLACK.stroke_width(1);
    root.draw(&PathElement::new(
        vec![(left - 1, top - 1), (left - 1, bottom), (right, bottom)],
        axis,
    ))?;
    let font = |size: u32| (FAMILY, size).into_font().color(&BLACK);
    let put =
        |s: &str, at: (i32, i32), size: u32, pos: Pos| -> Result<(), Box<dyn std::error::Error>> {
            if text {
                root.draw(&Text::new(s.to_string(), at, font(size).pos(pos)))?;
            }
            Ok(())
        };
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    put(
        &format!(
            "Sampled memory accesses over time: {} records of map `{name}`",
            points.len()
        ),
        (WIDTH as i32 / 2, 20),
        18,
        Pos::new(HPos::Center, VPos::Center),
    )?;

    // The address axis: each range named, with its first and last offset.
    for b in bands {
        let (bt, bb) = (top + b.top as i32, top + (b.top + b.rows) as i32 - 1);
        root.draw(&PathElement::new(
            vec![(left - 6, bt), (left - 1, bt)],
            axis,
        ))?;
        root.draw(&PathElement::new(
            vec![(left - 6, bb), (left - 1, bb)],
            axis,
        ))?;
        let right_aligned = |v| Pos::new(HPos::Right, v);
        put("+0", (left - 9, bt), 12, right_aligned(VPos::Top))?;
        put(
            &format!("+{}", bytes(b.hi - b.lo)),
            (left - 9, bb),
            12,
            right_aligned(VPos::Bottom),
        )?;
        let mid = (bt + bb) / 2;
        put(
            &band_name(b, points),
            (8, mid - 9),
            14,
            Pos::new(HPos::Left, VPos::Center),
        )?;
        put(
            &format!("{:#x}", b.lo),
            (8, mid + 9),
            12,
            Pos::new(HPos::Left, VPos::Center),
        )?;
    }
    put(
        "address (offset in each buffer), down",
        (8, bottom + 40),
        13,
        Pos::new(HPos::Left, VPos::Center),
    )?;

    // The time axis, in ms (µs for short runs) from the first sample.
    let span = (t1 - t0) as f64;
    let (unit, scale) = if span >= 2e6 {
        ("ms", 1e6)
    } else {
        ("µs", 1e3)
    };
    let step = nice_step(span / scale, 8.0);
    let mut t = 0.0;
    while t <= span / scale + 1e-9 {
        let x = left + ((t * scale / span.max(1.0)) * (PLOT_WIDTH as f64 - 1.0)) as i32;
        root.draw(&PathElement::new(vec![(x, bottom), (x, bottom + 5)], axis))?;
        put(
            &format!("{t}"),
            (x, bottom + 8),
            12,
            Pos::new(HPos::Center, VPos::Top),
        )?;
        t += step;
    }
    put(
        &format!("time since the first sample ({unit}), across"),
        ((left + right) / 2, bottom + 40),
        14,
        Pos::new(HPos::Center, VPos::Center),
    )?;

    // The colour scale, log like the heat map.
    let (cx, cw) = (right + 30, 18);
    for y in 0..PLOT_HEIGHT as i32 {
        let f = 1.0 - f64::from(y) / (PLOT_HEIGHT as f64 - 1.0);
        let [r, g, b] = colour(f);
        root.draw(&Rectangle::new(
            [(cx, top + y), (cx + cw, top + y + 1)],
            RGBColor(r, g, b).filled(),
        ))?;
    }
    root.draw(&Rectangle::new([(cx, top), (cx + cw, bottom)], axis))?;
    let mut tick = 1.0;
    while tick <= max {
        let f = (1.0 + tick).ln() / (1.0 + max).ln();
        let y = bottom - (f * PLOT_HEIGHT as f64) as i32;
        root.draw(&PathElement::new(
            vec![(cx + cw, y), (cx + cw + 5, y)],
            axis,
        ))?;
        put(
            &format!("{tick}"),
            (cx + cw + 8, y),
            12,
            Pos::new(HPos::Left, VPos::Center),
        )?;
        tick *= 10.0;
    }
    put(
        "accesses",
        (cx - 4, top - 22),
        12,
        Pos::new(HPos::Left, VPos::Center),
    )?;
    put(
        "per pixel",
        (cx - 4, top - 9),
        12,
        Pos::new(HPos::Left, VPos::Center),
    )?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(time_ns: u64, addr: u64, arg: Option<u64>) -> Sample {
        Sample { time_ns, addr, arg }
    }

    #[test]
    fn far_apart_buffers_get_bands_of_their_own() {
        let mib = 1u64 << 20;
        let mut addrs = Vec::new();
        for i in 0..100u64 {
            addrs.push(0x7000_0000_0000 + i * mib);
            addrs.push(0x7100_0000_0000 + i * mib / 4);
        }
        let b = bands(addrs.into_iter().map(|a| (a, None)), PLOT_HEIGHT);
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
        assert!(b[1].top + b[1].rows <= PLOT_HEIGHT);
    }

    /// vectorAdd's a, b and c, allocated one after the other: three ranges, each named by
    /// its argument, not one named by whichever had most samples.
    #[test]
    fn adjacent_buffers_of_different_arguments_get_ranges_of_their_own() {
        let mib = 1u64 << 20;
        let base = 0x7fd9_be00_2980u64;
        let mut points = Vec::new();
        for arg in 0..3u64 {
            for i in 0..64u64 {
                points.push(sample(i, base + arg * 64 * mib + i * mib, Some(arg)));
            }
        }
        let b = bands(points.iter().map(|p| (p.addr, p.arg)), PLOT_HEIGHT);
        assert_eq!(b.len(), 3);
        let names: Vec<String> = b.iter().map(|b| band_name(b, &points)).collect();
        assert_eq!(names, ["argument 0", "argument 1", "argument 2"]);
        assert_eq!(b[1].lo, base + 64 * mib);
        // Records that do not say stay in the range they fall in.
        points.push(sample(0, base + 64 * mib + 3, None));
        let b = bands(points.iter().map(|p| (p.addr, p.arg)), PLOT_HEIGHT);
        assert_eq!(b.len(), 3);
        // Two arguments interleaved over one buffer split it no more than the bound.
        let mixed: Vec<(u64, Option<u64>)> = (0..200u64)
            .map(|i| (base + i * 4096, Some(i % 2)))
            .collect();
        assert_eq!(bands(mixed.into_iter(), PLOT_HEIGHT).len(), 1);
    }

    /// The picture's pixels, decoded from the PNG our encoder wrote.
    fn pixels(png: &[u8]) -> Vec<u8> {
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
        raw.chunks_exact(WIDTH * 3 + 1)
            .flat_map(|r| r[1..].to_vec())
            .collect()
    }

    #[test]
    fn a_sweep_draws_a_diagonal_with_axes_names_and_a_scale() {
        let points: Vec<Sample> = (0..10_000u64)
            .map(|i| sample(i * 100, 0x1000 + i * 128, Some(2)))
            .collect();
        let dir = std::env::temp_dir().join(format!("bpftime-timeline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.png");
        let summary = write_png(&points, "timeline", &path).unwrap();
        assert!(
            summary.starts_with("10000 sampled accesses over 1.000 ms across, addresses down in 1 range(s): argument 2 0x1000.."),
            "{summary}"
        );
        let buf = pixels(&std::fs::read(&path).unwrap());
        let px =
            |x: usize, y: usize| <[u8; 3]>::try_from(&buf[(y * WIDTH + x) * 3..][..3]).unwrap();
        let plot = |x: usize, y: usize| px(PLOT_LEFT + x, PLOT_TOP + y);
        let lit = |x, y| plot(x, y) != [0, 0, 0];
        // Early accesses at low addresses, late ones at high: the diagonal is lit, the
        // opposite corners are not.
        assert!(lit(0, 0) && lit(PLOT_WIDTH - 1, PLOT_HEIGHT - 1));
        assert!(!lit(PLOT_WIDTH - 1, 0) && !lit(0, PLOT_HEIGHT - 1));
        // The axes: a black line left of and below the heat map.
        assert_eq!(px(PLOT_LEFT - 1, PLOT_TOP + PLOT_HEIGHT / 2), [0, 0, 0]);
        assert_eq!(
            px(PLOT_LEFT + PLOT_WIDTH / 2, PLOT_TOP + PLOT_HEIGHT),
            [0, 0, 0]
        );
        // The colour scale right of it runs from the brightest colour at the top to the
        // darkest at the bottom.
        let bar = PLOT_LEFT + PLOT_WIDTH + 30 + 9;
        assert_eq!(
            px(bar, PLOT_TOP + 1),
            colour(1.0 - 1.0 / (PLOT_HEIGHT as f64 - 1.0))
        );
        assert_eq!(
            px(bar, PLOT_TOP + PLOT_HEIGHT - 2),
            colour(1.0 / (PLOT_HEIGHT as f64 - 1.0))
        );
        // Words: where a font is found, the title and the buffers' names put dark
        // pixels on the white margins.
        if font_ready() {
            let dark = |x0: usize, x1: usize, y0: usize, y1: usize| {
                (y0..y1).any(|y| (x0..x1).any(|x| px(x, y).iter().all(|c| *c < 128)))
            };
            assert!(dark(0, WIDTH, 0, PLOT_TOP - 20), "no title");
            assert!(
                dark(0, PLOT_LEFT - 60, PLOT_TOP, PLOT_TOP + PLOT_HEIGHT),
                "no buffer name"
            );
            assert!(
                dark(
                    PLOT_LEFT,
                    PLOT_LEFT + PLOT_WIDTH,
                    PLOT_TOP + PLOT_HEIGHT + 8,
                    HEIGHT
                ),
                "no time axis"
            );
        } else {
            errln!("skipping the check of the picture's words: no font on this machine");
            assert!(summary.contains("no font found"), "{summary}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_band_is_named_by_the_argument_most_of_its_accesses_fall_in() {
        let band = Band {
            lo: 0,
            hi: 1000,
            top: 0,
            rows: 10,
        };
        let mut points = vec![
            sample(0, 10, Some(1)),
            sample(0, 20, Some(1)),
            sample(0, 30, Some(0)),
        ];
        assert_eq!(band_name(&band, &points), "argument 1");
        points.push(sample(0, 5000, Some(0)));
        points.push(sample(0, 5001, Some(0)));
        assert_eq!(
            band_name(&band, &points),
            "argument 1",
            "accesses outside the band do not vote"
        );
        assert_eq!(band_name(&band, &[sample(0, 1, None)]), "buffer");
        assert_eq!(band_name(&band, &[sample(0, 1, Some(6))]), "no argument");
    }

    #[test]
    fn ticks_are_round_numbers() {
        assert_eq!(nice_step(1.0, 8.0), 0.2);
        assert_eq!(nice_step(37.0, 8.0), 5.0);
        assert_eq!(nice_step(1200.0, 8.0), 200.0);
    }

    #[test]
    fn chunk_checksums_are_crc32() {
        // The CRC of "IEND" with no data, as every PNG ends.
        assert_eq!(crc32(&[b"IEND", b""]), 0xae42_6082);
        assert_eq!(crc32(&[b"123456789"]), 0xcbf4_3926);
    }

    #[test]
    fn no_points_is_an_error_not_an_empty_picture() {
        let e = write_png(&[], "timeline", Path::new("/nonexistent/x.png")).unwrap_err();
        assert!(e.to_string().contains("no accesses"), "{e}");
    }
}
