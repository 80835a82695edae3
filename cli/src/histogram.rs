//! Log2 histograms drawn the way bpftrace draws `hist()`: one line per
//! power-of-two bucket, from the first non-empty bucket to the last, each with
//! its count and a bar of `@` scaled to the fullest bucket.
//!
//! Slot `i` holds values in `[2^i, 2^(i+1))`, and slot 0 also holds 0, which is
//! what a program gets from `floor(log2(v))` (bpf-examples/funclatency).

const BAR_WIDTH: u64 = 52;

/// `n` with a binary suffix when it is a whole number of KiB, MiB, ...
fn human(n: u128) -> String {
    const SUFFIXES: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = n;
    let mut i = 0;
    while v >= 1024 && v.is_multiple_of(1024) && i + 1 < SUFFIXES.len() {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", SUFFIXES[i])
}

fn bucket_label(slot: u32) -> String {
    let lo: u128 = if slot == 0 { 0 } else { 1u128 << slot };
    let hi: u128 = 1u128 << (slot + 1);
    format!("[{}, {})", human(lo), human(hi))
}

/// Draws `counts` (slot -> count; slots may come in any order) as lines.
pub fn draw(counts: &[(u32, u64)]) -> Vec<String> {
    let mut by_slot: Vec<(u32, u64)> = counts.iter().copied().filter(|&(s, _)| s < 127).collect();
    by_slot.sort_unstable();
    let nonzero: Vec<u32> = by_slot.iter().filter(|c| c.1 > 0).map(|c| c.0).collect();
    let (Some(&first), Some(&last)) = (nonzero.first(), nonzero.last()) else {
        return vec!["(empty)".to_string()];
    };
    let max = by_slot.iter().map(|c| c.1).max().unwrap_or(1).max(1);
    (first..=last)
        .map(|slot| {
            let count: u64 = by_slot.iter().filter(|c| c.0 == slot).map(|c| c.1).sum();
            let bar = (count as u128 * BAR_WIDTH as u128 / max as u128) as usize;
            format!(
                "{:<20}{:>9} |{:<width$}|",
                bucket_label(slot),
                count,
                "@".repeat(bar),
                width = BAR_WIDTH as usize
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(bucket_label(0), "[0, 2)");
        assert_eq!(bucket_label(1), "[2, 4)");
        assert_eq!(bucket_label(9), "[512, 1K)");
        assert_eq!(bucket_label(10), "[1K, 2K)");
        assert_eq!(bucket_label(20), "[1M, 2M)");
        assert_eq!(bucket_label(63), "[8E, 16E)");
    }

    #[test]
    fn draws_from_first_to_last_nonzero_with_scaled_bars() {
        let lines = draw(&[(3, 0), (4, 10), (5, 0), (6, 5), (7, 0)]);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].starts_with("[16, 32)"));
        assert!(lines[0].contains(&format!("|{}|", "@".repeat(52))));
        assert!(lines[1].contains(&format!("0 |{}|", " ".repeat(52))));
        assert!(lines[2].contains(&format!("5 |{}{}|", "@".repeat(26), " ".repeat(26))));
    }

    #[test]
    fn empty() {
        assert_eq!(draw(&[(0, 0), (1, 0)]), vec!["(empty)"]);
    }
}
