//! What several of the attach crate's test binaries share.

/// Pairs whose `cmp` sets each status flag, OF included, and clears it.
pub const CMP_CASES: [(u64, u64); 7] = [
    (1, 2),
    (2, 1),
    (5, 5),
    (i64::MIN as u64, 1),
    (i64::MAX as u64, u64::MAX),
    (0x10, 0x01),
    (0, 0x8000_0000_0000_0000),
];
