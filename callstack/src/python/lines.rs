//! The source line of an instruction, from a code object's line table (a copy of
//! `co_linetable`), as CPython's `PyCode_Addr2Line` gives it.

use super::layout::LineTable;

/// The line of the instruction at `unit` (an index in 16-bit code units), or none where
/// the table gives it none, exactly as CPython has it (a module's first instruction is on
/// line 0). An instruction before the first (a frame not yet started) is on the first
/// line.
pub(crate) fn line_at(format: LineTable, table: &[u8], first_line: i32, unit: i32) -> Option<i32> {
    if unit < 0 {
        return Some(first_line);
    }
    match format {
        LineTable::Pairs => pairs(table, first_line, unit as u64 * 2),
        LineTable::Locations => locations(table, first_line, unit as u64),
    }
}

/// 3.10's table: (bytes covered: u8, line delta: i8) pairs from line `first_line` at
/// byte 0; a delta of -128 means the bytes have no line. A long range or a large delta
/// is split over several pairs, some covering no bytes.
fn pairs(table: &[u8], first_line: i32, byte: u64) -> Option<i32> {
    let mut start = 0u64;
    let mut line = first_line;
    for pair in table.chunks_exact(2) {
        let end = start + u64::from(pair[0]);
        let delta = pair[1] as i8;
        let here = if delta == -128 {
            None
        } else {
            line = line.wrapping_add(i32::from(delta));
            Some(line)
        };
        if (start..end).contains(&byte) {
            return here;
        }
        start = end;
    }
    None
}

/// 3.11's and later table: entries, each opening with a byte whose top bit is set: bits
/// 3-6 the entry's kind, bits 0-2 the code units it covers less one. Kinds 0-9 keep the
/// line (one byte of columns follows), 10-12 add `kind - 10` (two bytes of columns), 13
/// adds a signed varint (no columns), 14 adds a signed varint and three varints follow
/// (end line, columns), 15 has no location. Varints are 6 bits a byte, low first, bit 6
/// saying another byte follows; signed ones keep the sign in their lowest bit.
fn locations(table: &[u8], first_line: i32, unit: u64) -> Option<i32> {
    let mut r = Reader { table, at: 0 };
    let mut start = 0u64;
    let mut line = first_line;
    while let Some(head) = r.byte() {
        if head & 0x80 == 0 {
            // Not at an entry: the table is not one this reads.
            return None;
        }
        let kind = (head >> 3) & 0xf;
        let end = start + u64::from(head & 7) + 1;
        let here = match kind {
            0..=9 => {
                r.byte()?;
                Some(line)
            }
            10..=12 => {
                r.byte()?;
                r.byte()?;
                line = line.wrapping_add(i32::from(kind) - 10);
                Some(line)
            }
            13 => {
                line = line.wrapping_add(r.signed()?);
                Some(line)
            }
            14 => {
                line = line.wrapping_add(r.signed()?);
                for _ in 0..3 {
                    r.varint()?;
                }
                Some(line)
            }
            _ => None,
        };
        if (start..end).contains(&unit) {
            return here;
        }
        start = end;
    }
    None
}

struct Reader<'a> {
    table: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.table.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<u32> {
        let mut value = 0u32;
        let mut shift = 0;
        loop {
            let b = self.byte()?;
            value |= u32::from(b & 0x3f).checked_shl(shift)?;
            if b & 0x40 == 0 {
                return Some(value);
            }
            shift += 6;
        }
    }

    fn signed(&mut self) -> Option<i32> {
        let v = self.varint()?;
        let magnitude = (v >> 1) as i32;
        Some(if v & 1 == 1 { -magnitude } else { magnitude })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_give_the_line_of_each_byte_range() {
        // Bytes 0-5 on line 10 (first line), 6-9 on 12, 10-13 without a line, 14-15 on 9;
        // then a delta split over a pair covering nothing: 16-17 on 9 + 120 + 30.
        let table = [6, 0, 4, 2, 4, 0x80, 2, (-3i8) as u8, 0, 120, 2, 30];
        let at = |unit| line_at(LineTable::Pairs, &table, 10, unit);
        assert_eq!(
            [at(0), at(2), at(3), at(4)],
            [Some(10), Some(10), Some(12), Some(12)]
        );
        assert_eq!(
            [at(5), at(6), at(7), at(8)],
            [None, None, Some(9), Some(159)]
        );
        assert_eq!(at(9), None, "past the table");
        assert_eq!(at(-1), Some(10), "before the first instruction");
    }

    #[test]
    fn locations_give_the_line_of_each_code_unit() {
        let table = [
            // 1 unit, short form (same line: 5) with a column byte.
            0x80,
            0x00,
            // 2 units, one-line form +2 (line 7), two column bytes.
            0x80 | (12 << 3) | 1,
            4,
            9,
            // 1 unit, no columns, -3 as a signed varint (3 << 1 | 1): line 4.
            0x80 | (13 << 3),
            7,
            // 1 unit, no location.
            0x80 | (15 << 3),
            // 3 units, long form: +100 (200 as a two-byte varint: 8 | 0x40, 3), end line
            // delta, two columns.
            0x80 | (14 << 3) | 2,
            0x40 | 8,
            3,
            0,
            1,
            2,
        ];
        let at = |unit| line_at(LineTable::Locations, &table, 5, unit);
        assert_eq!(
            (0..8).map(at).collect::<Vec<_>>(),
            [
                Some(5),
                Some(7),
                Some(7),
                Some(4),
                None,
                Some(104),
                Some(104),
                Some(104)
            ]
        );
        assert_eq!(at(8), None);
    }

    #[test]
    fn random_tables_give_some_answer_and_never_panic() {
        // A small xorshift: the same tables on every run.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 48) as usize;
            let table: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let first = (next() % 2000) as i32 - 1000;
            let unit = (next() % 64) as i32 - 2;
            let _ = line_at(LineTable::Locations, &table, first, unit);
            let _ = line_at(LineTable::Pairs, &table, first, unit);
        }
    }

    #[test]
    fn a_table_that_is_not_one_gives_no_line_and_no_panic() {
        for table in [
            &[0x00u8, 1][..],
            &[0xf0 | 0x80 | (14 << 3), 0xff][..],
            &[0xc7][..],
        ] {
            for unit in 0..4 {
                let _ = line_at(LineTable::Locations, table, 1, unit);
                let _ = line_at(LineTable::Pairs, table, 1, unit);
            }
        }
        let endless = [0x80 | (14 << 3), 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f];
        assert_eq!(line_at(LineTable::Locations, &endless, 1, 0), None);
        assert_eq!(line_at(LineTable::Pairs, &[], 1, 0), None);
    }
}
