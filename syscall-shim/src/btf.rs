//! Just enough of BTF's type section to check a map's key and value types as the
//! kernel does at `BPF_MAP_CREATE`: a type's size, and whether it is a 32-bit int.

/// A type as the checks need it, modifiers and typedefs followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub size: u32,
    /// An integer of 32 bits at offset 0 (the kernel's `btf_type_is_i32`).
    pub is_i32: bool,
}

mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// Offsets of the types of `blob`, by id (index 0 is `void`).
fn type_offsets(blob: &[u8]) -> Option<Vec<usize>> {
    let u32_at = |off: usize| Some(u32::from_ne_bytes(blob.get(off..off + 4)?.try_into().ok()?));
    if u16::from_ne_bytes(blob.get(0..2)?.try_into().ok()?) != 0xeb9f {
        return None;
    }
    let hdr_len = u32_at(4)? as usize;
    let start = hdr_len.checked_add(u32_at(8)? as usize)?;
    let end = start.checked_add(u32_at(12)? as usize)?;
    if end > blob.len() {
        return None;
    }
    let mut offsets = vec![0];
    let mut at = start;
    while at < end {
        offsets.push(at);
        let info = u32_at(at + 4)?;
        let vlen = (info & 0xffff) as usize;
        let extra = match (info >> 24) & 0x1f {
            kind::INT | kind::VAR | kind::DECL_TAG => 4,
            kind::ARRAY => 12,
            kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * vlen,
            kind::ENUM | kind::FUNC_PROTO => 8 * vlen,
            _ => 0,
        };
        at += 12 + extra;
    }
    Some(offsets)
}

/// Resolves type `id` of `blob`, or `None` for a type without a size (void, a
/// function, a forward declaration) or a malformed blob.
pub(crate) fn resolve(blob: &[u8], id: u32) -> Option<Resolved> {
    let offsets = type_offsets(blob)?;
    let u32_at = |off: usize| Some(u32::from_ne_bytes(blob.get(off..off + 4)?.try_into().ok()?));
    let mut id = id as usize;
    // Chains of modifiers are short; a loop in a bad blob must still end.
    for _ in 0..32 {
        let at = *offsets.get(id).filter(|_| id != 0)?;
        let info = u32_at(at + 4)?;
        let size_or_type = u32_at(at + 8)?;
        return match (info >> 24) & 0x1f {
            kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                id = size_or_type as usize;
                continue;
            }
            kind::INT => {
                let data = u32_at(at + 12)?;
                Some(Resolved {
                    size: size_or_type,
                    is_i32: size_or_type == 4 && data & 0xff == 32 && (data >> 16) & 0xff == 0,
                })
            }
            kind::STRUCT
            | kind::UNION
            | kind::ENUM
            | kind::ENUM64
            | kind::FLOAT
            | kind::DATASEC => Some(Resolved {
                size: size_or_type,
                is_i32: false,
            }),
            kind::PTR => Some(Resolved {
                size: 8,
                is_i32: false,
            }),
            kind::ARRAY => {
                let elem = resolve(blob, u32_at(at + 12)?)?;
                Some(Resolved {
                    size: elem.size.checked_mul(u32_at(at + 20)?)?,
                    is_i32: false,
                })
            }
            _ => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob() -> Vec<u8> {
        let strs = b"\0int\0long\0";
        let mut t = vec![];
        let mut push = |w: &[u32]| w.iter().for_each(|v| t.extend(v.to_ne_bytes()));
        push(&[1, 1 << 24, 4, 32]); // [1] int
        push(&[5, 1 << 24, 8, 64]); // [2] long
        push(&[0, 8 << 24, 1]); // [3] typedef -> int
        push(&[0, 3 << 24, 0, 2, 1, 3]); // [4] long[3]
        push(&[0, 10 << 24, 4]); // [5] const long[3]
        let mut b = vec![];
        b.extend(0xeb9fu16.to_ne_bytes());
        b.extend([1, 0]);
        for v in [24u32, 0, t.len() as u32, t.len() as u32, strs.len() as u32] {
            b.extend(v.to_ne_bytes());
        }
        b.extend(t);
        b.extend(strs);
        b
    }

    #[test]
    fn resolves_sizes_through_modifiers_and_arrays() {
        let b = blob();
        let r = |id| resolve(&b, id);
        assert_eq!(
            r(1),
            Some(Resolved {
                size: 4,
                is_i32: true
            })
        );
        assert_eq!(
            r(2),
            Some(Resolved {
                size: 8,
                is_i32: false
            })
        );
        assert_eq!(
            r(3),
            Some(Resolved {
                size: 4,
                is_i32: true
            })
        );
        assert_eq!(r(5).map(|t| t.size), Some(24));
        assert_eq!(r(0), None);
        assert_eq!(r(9), None);
    }
}
