//! The numeric domain: known bits (a "tnum") combined with signed and unsigned 64-bit
//! ranges. The two views refine each other after every operation, so a mask learned
//! from `&` bounds a later comparison and a comparison narrows the known bits.

use std::fmt;

/// Known bits: every bit set in `mask` is unknown; the others equal `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tnum {
    pub value: u64,
    pub mask: u64,
}

impl Tnum {
    pub const UNKNOWN: Tnum = Tnum {
        value: 0,
        mask: u64::MAX,
    };

    pub const fn konst(v: u64) -> Tnum {
        Tnum { value: v, mask: 0 }
    }

    /// The smallest tnum holding every value of `[min, max]`.
    pub fn range(min: u64, max: u64) -> Tnum {
        let chi = min ^ max;
        if chi == 0 {
            return Tnum::konst(min);
        }
        let bits = 64 - chi.leading_zeros();
        if bits >= 64 {
            return Tnum::UNKNOWN;
        }
        let delta = (1u64 << bits) - 1;
        Tnum {
            value: min & !delta,
            mask: delta,
        }
    }

    pub fn is_const(self) -> bool {
        self.mask == 0
    }

    pub fn plus(self, o: Tnum) -> Tnum {
        let sm = self.mask.wrapping_add(o.mask);
        let sv = self.value.wrapping_add(o.value);
        let sigma = sm.wrapping_add(sv);
        let chi = sigma ^ sv;
        let mu = chi | self.mask | o.mask;
        Tnum {
            value: sv & !mu,
            mask: mu,
        }
    }

    pub fn minus(self, o: Tnum) -> Tnum {
        let dv = self.value.wrapping_sub(o.value);
        let alpha = dv.wrapping_add(self.mask);
        let beta = dv.wrapping_sub(o.mask);
        let chi = alpha ^ beta;
        let mu = chi | self.mask | o.mask;
        Tnum {
            value: dv & !mu,
            mask: mu,
        }
    }

    pub fn and(self, o: Tnum) -> Tnum {
        let alpha = self.value | self.mask;
        let beta = o.value | o.mask;
        let v = self.value & o.value;
        Tnum {
            value: v,
            mask: alpha & beta & !v,
        }
    }

    pub fn or(self, o: Tnum) -> Tnum {
        let v = self.value | o.value;
        let mu = self.mask | o.mask;
        Tnum {
            value: v,
            mask: mu & !v,
        }
    }

    pub fn xor(self, o: Tnum) -> Tnum {
        let v = self.value ^ o.value;
        let mu = self.mask | o.mask;
        Tnum {
            value: v & !mu,
            mask: mu,
        }
    }

    /// Shift-and-add over the bits of `self`: each certain bit adds a shifted copy of
    /// `o`, each uncertain bit widens the mask by one.
    pub fn times(self, o: Tnum) -> Tnum {
        if self.is_const() && o.is_const() {
            return Tnum::konst(self.value.wrapping_mul(o.value));
        }
        let mut a = self;
        let mut b = o;
        let acc_v = a.value.wrapping_mul(b.value);
        let mut acc_m = Tnum::konst(0);
        while a.value != 0 || a.mask != 0 {
            if a.value & 1 != 0 {
                acc_m = acc_m.plus(Tnum {
                    value: 0,
                    mask: b.mask,
                });
            } else if a.mask & 1 != 0 {
                acc_m = acc_m.plus(Tnum {
                    value: 0,
                    mask: b.value | b.mask,
                });
            }
            a = a.rsh(1);
            b = b.lsh(1);
        }
        Tnum::konst(acc_v).plus(acc_m)
    }

    pub fn lsh(self, s: u32) -> Tnum {
        Tnum {
            value: self.value << s,
            mask: self.mask << s,
        }
    }

    pub fn rsh(self, s: u32) -> Tnum {
        Tnum {
            value: self.value >> s,
            mask: self.mask >> s,
        }
    }

    pub fn arsh(self, s: u32) -> Tnum {
        Tnum {
            value: ((self.value as i64) >> s) as u64,
            mask: ((self.mask as i64) >> s) as u64,
        }
    }

    /// Keeps the low `bytes` bytes, the rest known zero.
    pub fn cast(self, bytes: u32) -> Tnum {
        if bytes >= 8 {
            return self;
        }
        let m = (1u64 << (bytes * 8)) - 1;
        Tnum {
            value: self.value & m,
            mask: self.mask & m,
        }
    }

    /// The smallest tnum holding the values of both.
    pub fn union(self, o: Tnum) -> Tnum {
        let mask = self.mask | o.mask | (self.value ^ o.value);
        Tnum {
            value: self.value & !mask,
            mask,
        }
    }

    /// True when every value is a multiple of `size` (a power of two).
    pub fn aligned(self, size: u64) -> bool {
        (self.value | self.mask) & (size - 1) == 0
    }

    /// Values both tnums allow, or `None` when a known bit disagrees.
    pub fn intersect(self, o: Tnum) -> Option<Tnum> {
        let known_both = !self.mask & !o.mask;
        if (self.value ^ o.value) & known_both != 0 {
            return None;
        }
        let v = self.value | o.value;
        let mu = self.mask & o.mask;
        Some(Tnum {
            value: v & !mu,
            mask: mu,
        })
    }

    /// True when every value of `o` is a value of `self`.
    pub fn contains(self, o: Tnum) -> bool {
        if o.mask & !self.mask != 0 {
            return false;
        }
        (o.value & !self.mask) == self.value
    }

    pub fn min(self) -> u64 {
        self.value
    }

    pub fn max(self) -> u64 {
        self.value | self.mask
    }
}

/// A 64-bit value known only by its ranges and known bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scalar {
    pub umin: u64,
    pub umax: u64,
    pub smin: i64,
    pub smax: i64,
    pub tnum: Tnum,
}

impl Scalar {
    pub const UNKNOWN: Scalar = Scalar {
        umin: 0,
        umax: u64::MAX,
        smin: i64::MIN,
        smax: i64::MAX,
        tnum: Tnum::UNKNOWN,
    };

    pub fn konst(v: u64) -> Scalar {
        Scalar {
            umin: v,
            umax: v,
            smin: v as i64,
            smax: v as i64,
            tnum: Tnum::konst(v),
        }
    }

    pub fn urange(min: u64, max: u64) -> Scalar {
        Scalar {
            umin: min,
            umax: max,
            ..Scalar::UNKNOWN
        }
        .normalized()
        .unwrap_or(Scalar::UNKNOWN)
    }

    /// An unknown value zero-extended from `bytes` bytes.
    pub fn unknown_bytes(bytes: u32) -> Scalar {
        if bytes >= 8 {
            Scalar::UNKNOWN
        } else {
            Scalar::urange(0, (1u64 << (bytes * 8)) - 1)
        }
    }

    pub fn from_tnum(t: Tnum) -> Scalar {
        Scalar {
            tnum: t,
            ..Scalar::UNKNOWN
        }
        .normalized()
        .unwrap_or(Scalar::UNKNOWN)
    }

    pub fn as_const(&self) -> Option<u64> {
        self.tnum.is_const().then_some(self.tnum.value)
    }

    pub fn is_unbounded(&self) -> bool {
        *self == Scalar::UNKNOWN
    }

    /// Lets each view narrow the others until they agree; `None` means no value fits,
    /// which branch refinement reads as "this branch is never taken".
    pub fn normalized(mut self) -> Option<Scalar> {
        for _ in 0..2 {
            // Known bits bound both ranges.
            self.umin = self.umin.max(self.tnum.min());
            self.umax = self.umax.min(self.tnum.max());
            let sign = 1u64 << 63;
            if self.tnum.mask & sign == 0 {
                self.smin = self.smin.max(self.tnum.value as i64);
                self.smax = self.smax.min((self.tnum.value | self.tnum.mask) as i64);
            } else {
                self.smin = self.smin.max((self.tnum.value | sign) as i64);
                self.smax = self
                    .smax
                    .min(((self.tnum.value | self.tnum.mask) & !sign) as i64);
            }
            // A signed range on one side of zero is also an unsigned range.
            if self.smin >= 0 || self.smax < 0 {
                self.umin = self.umin.max(self.smin as u64);
                self.umax = self.umax.min(self.smax as u64);
            }
            // An unsigned range that does not cross the sign bit is also a signed range.
            if (self.umin as i64) <= (self.umax as i64) {
                self.smin = self.smin.max(self.umin as i64);
                self.smax = self.smax.min(self.umax as i64);
            }
            if self.umin > self.umax || self.smin > self.smax {
                return None;
            }
            self.tnum = self.tnum.intersect(Tnum::range(self.umin, self.umax))?;
        }
        if self.umin > self.umax || self.smin > self.smax {
            return None;
        }
        Some(self)
    }

    fn fixup(self) -> Scalar {
        self.normalized().unwrap_or(Scalar::UNKNOWN)
    }

    /// True when every value of `o` is a value of `self`.
    pub fn contains(&self, o: &Scalar) -> bool {
        self.umin <= o.umin
            && self.umax >= o.umax
            && self.smin <= o.smin
            && self.smax >= o.smax
            && self.tnum.contains(o.tnum)
    }

    /// Smallest scalar holding both (used to widen loop states).
    pub fn join(&self, o: &Scalar) -> Scalar {
        let mask = self.tnum.mask | o.tnum.mask | (self.tnum.value ^ o.tnum.value);
        Scalar {
            umin: self.umin.min(o.umin),
            umax: self.umax.max(o.umax),
            smin: self.smin.min(o.smin),
            smax: self.smax.max(o.smax),
            tnum: Tnum {
                value: self.tnum.value & !mask,
                mask,
            },
        }
        .fixup()
    }

    /// The value as a 32-bit subregister, zero-extended.
    pub fn trunc32(&self) -> Scalar {
        if self.umax <= u32::MAX as u64 {
            return *self;
        }
        Scalar::from_tnum(self.tnum.cast(4))
    }

    pub fn add(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar {
            tnum: self.tnum.plus(o.tnum),
            ..Scalar::UNKNOWN
        };
        if let (Some(lo), Some(hi)) = (self.smin.checked_add(o.smin), self.smax.checked_add(o.smax))
        {
            r.smin = lo;
            r.smax = hi;
        }
        if let (Some(lo), Some(hi)) = (self.umin.checked_add(o.umin), self.umax.checked_add(o.umax))
        {
            r.umin = lo;
            r.umax = hi;
        }
        r.fixup()
    }

    pub fn sub(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar {
            tnum: self.tnum.minus(o.tnum),
            ..Scalar::UNKNOWN
        };
        if let (Some(lo), Some(hi)) = (self.smin.checked_sub(o.smax), self.smax.checked_sub(o.smin))
        {
            r.smin = lo;
            r.smax = hi;
        }
        if self.umin >= o.umax {
            r.umin = self.umin - o.umax;
            r.umax = self.umax - o.umin;
        }
        r.fixup()
    }

    pub fn mul(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar {
            tnum: self.tnum.times(o.tnum),
            ..Scalar::UNKNOWN
        };
        if let Some(hi) = self.umax.checked_mul(o.umax) {
            r.umin = self.umin * o.umin;
            r.umax = hi;
        }
        r.fixup()
    }

    /// Unsigned division; the ISA defines `x / 0 == 0`.
    pub fn udiv(&self, o: &Scalar) -> Scalar {
        match (self.as_const(), o.as_const()) {
            (Some(a), Some(b)) => Scalar::konst(a.checked_div(b).unwrap_or(0)),
            (_, Some(b)) if b != 0 => Scalar::urange(self.umin / b, self.umax / b),
            _ => Scalar::urange(0, self.umax),
        }
    }

    /// Unsigned modulo; the ISA defines `x % 0 == x`.
    pub fn umod(&self, o: &Scalar) -> Scalar {
        match (self.as_const(), o.as_const()) {
            (Some(a), Some(b)) => Scalar::konst(a.checked_rem(b).unwrap_or(a)),
            (_, Some(b)) if b != 0 => Scalar::urange(0, self.umax.min(b - 1)),
            _ => Scalar::urange(0, self.umax),
        }
    }

    pub fn sdiv(&self, o: &Scalar) -> Scalar {
        match (self.as_const(), o.as_const()) {
            (Some(a), Some(b)) => {
                let (a, b) = (a as i64, b as i64);
                Scalar::konst(if b == 0 { 0 } else { a.wrapping_div(b) as u64 })
            }
            _ => Scalar::UNKNOWN,
        }
    }

    pub fn smod(&self, o: &Scalar) -> Scalar {
        match (self.as_const(), o.as_const()) {
            (Some(a), Some(b)) => {
                let (a, b) = (a as i64, b as i64);
                Scalar::konst(if b == 0 {
                    a as u64
                } else {
                    a.wrapping_rem(b) as u64
                })
            }
            _ => Scalar::UNKNOWN,
        }
    }

    pub fn and(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar {
            tnum: self.tnum.and(o.tnum),
            ..Scalar::UNKNOWN
        };
        r.umax = self.umax.min(o.umax);
        r.fixup()
    }

    pub fn or(&self, o: &Scalar) -> Scalar {
        let mut r = Scalar {
            tnum: self.tnum.or(o.tnum),
            ..Scalar::UNKNOWN
        };
        r.umin = self.umin.max(o.umin);
        r.fixup()
    }

    pub fn xor(&self, o: &Scalar) -> Scalar {
        Scalar::from_tnum(self.tnum.xor(o.tnum))
    }

    /// Shift by a possibly unknown amount, masked to the operand width like the ISA does.
    pub fn shift(&self, o: &Scalar, op: Shift, bits: u32) -> Scalar {
        let Some(s) = o.as_const() else {
            return match op {
                Shift::Right => Scalar::urange(0, self.umax),
                _ => Scalar::UNKNOWN,
            };
        };
        let s = (s & (bits as u64 - 1)) as u32;
        match op {
            Shift::Left => {
                let mut r = Scalar::from_tnum(self.tnum.lsh(s));
                if self.umax.leading_zeros() >= s {
                    r.umin = self.umin << s;
                    r.umax = self.umax << s;
                    r = r.fixup();
                }
                r
            }
            Shift::Right => {
                let mut r = Scalar::from_tnum(self.tnum.rsh(s));
                r.umin = self.umin >> s;
                r.umax = self.umax >> s;
                r.fixup()
            }
            Shift::Arith => {
                let mut r = Scalar::from_tnum(self.tnum.arsh(s));
                r.smin = self.smin >> s;
                r.smax = self.smax >> s;
                r.umin = 0;
                r.umax = u64::MAX;
                r.fixup()
            }
        }
    }

    /// Sign extension from `bytes` bytes to 64 bits.
    pub fn sext(&self, bytes: u32) -> Scalar {
        let bits = bytes * 8;
        if let Some(c) = self.as_const() {
            let sh = 64 - bits;
            return Scalar::konst((((c << sh) as i64) >> sh) as u64);
        }
        if self.umax < (1u64 << (bits - 1)) {
            return *self;
        }
        let lo = -(1i64 << (bits - 1));
        let hi = (1i64 << (bits - 1)) - 1;
        Scalar {
            smin: lo,
            smax: hi,
            ..Scalar::UNKNOWN
        }
        .fixup()
    }

    pub fn bswap(&self, bytes: u32, to_be: bool) -> Scalar {
        match self.as_const() {
            Some(c) => {
                let v = match (bytes, to_be) {
                    (2, true) => (c as u16).swap_bytes() as u64,
                    (4, true) => (c as u32).swap_bytes() as u64,
                    (8, true) => c.swap_bytes(),
                    (2, false) => c as u16 as u64,
                    (4, false) => c as u32 as u64,
                    _ => c,
                };
                Scalar::konst(v)
            }
            None if bytes < 8 => Scalar::unknown_bytes(bytes),
            None => Scalar::UNKNOWN,
        }
    }

    /// Narrows `self`/`o` to the values where `self op o` holds, or `None` if none do.
    pub fn refine(&self, o: &Scalar, op: Cmp) -> Option<(Scalar, Scalar)> {
        let (mut a, mut b) = (*self, *o);
        match op {
            Cmp::Eq => {
                let t = a.tnum.intersect(b.tnum)?;
                let m = Scalar {
                    umin: a.umin.max(b.umin),
                    umax: a.umax.min(b.umax),
                    smin: a.smin.max(b.smin),
                    smax: a.smax.min(b.smax),
                    tnum: t,
                }
                .normalized()?;
                return Some((m, m));
            }
            Cmp::Ne => {
                if let (Some(x), Some(y)) = (a.as_const(), b.as_const()) {
                    return (x != y).then_some((a, b));
                }
                if let Some(y) = b.as_const() {
                    a = shave(a, y)?;
                }
                if let Some(x) = a.as_const() {
                    b = shave(b, x)?;
                }
            }
            Cmp::Gt => {
                a.umin = a.umin.max(b.umin.checked_add(1)?);
                b.umax = b.umax.min(a.umax.checked_sub(1)?);
            }
            Cmp::Ge => {
                a.umin = a.umin.max(b.umin);
                b.umax = b.umax.min(a.umax);
            }
            Cmp::Lt => return o.refine(self, Cmp::Gt).map(|(x, y)| (y, x)),
            Cmp::Le => return o.refine(self, Cmp::Ge).map(|(x, y)| (y, x)),
            Cmp::Sgt => {
                a.smin = a.smin.max(b.smin.checked_add(1)?);
                b.smax = b.smax.min(a.smax.checked_sub(1)?);
            }
            Cmp::Sge => {
                a.smin = a.smin.max(b.smin);
                b.smax = b.smax.min(a.smax);
            }
            Cmp::Slt => return o.refine(self, Cmp::Sgt).map(|(x, y)| (y, x)),
            Cmp::Sle => return o.refine(self, Cmp::Sge).map(|(x, y)| (y, x)),
            Cmp::Set => {
                if let Some(m) = b.as_const() {
                    if a.tnum.max() & m == 0 {
                        return None;
                    }
                }
            }
            Cmp::NotSet => {
                if let Some(m) = b.as_const() {
                    if a.tnum.min() & m != 0 {
                        return None;
                    }
                    let t = a.tnum.intersect(Tnum { value: 0, mask: !m })?;
                    a.tnum = t;
                }
            }
        }
        Some((a.normalized()?, b.normalized()?))
    }
}

/// Drops `y` from an end of the range, the only way an interval can exclude a value.
fn shave(mut a: Scalar, y: u64) -> Option<Scalar> {
    if a.umin == y {
        a.umin = a.umin.checked_add(1)?;
    }
    if a.umax == y {
        a.umax = a.umax.checked_sub(1)?;
    }
    if a.smin == y as i64 {
        a.smin = a.smin.checked_add(1)?;
    }
    if a.smax == y as i64 {
        a.smax = a.smax.checked_sub(1)?;
    }
    a.normalized()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shift {
    Left,
    Right,
    Arith,
}

/// A comparison, as a conditional jump tests it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
    Sgt,
    Sge,
    Slt,
    Sle,
    Set,
    NotSet,
}

impl Cmp {
    pub fn negate(self) -> Cmp {
        match self {
            Cmp::Eq => Cmp::Ne,
            Cmp::Ne => Cmp::Eq,
            Cmp::Gt => Cmp::Le,
            Cmp::Ge => Cmp::Lt,
            Cmp::Lt => Cmp::Ge,
            Cmp::Le => Cmp::Gt,
            Cmp::Sgt => Cmp::Sle,
            Cmp::Sge => Cmp::Slt,
            Cmp::Slt => Cmp::Sge,
            Cmp::Sle => Cmp::Sgt,
            Cmp::Set => Cmp::NotSet,
            Cmp::NotSet => Cmp::Set,
        }
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Cmp::Sgt | Cmp::Sge | Cmp::Slt | Cmp::Sle)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(c) = self.as_const() {
            return write!(f, "{}", c as i64);
        }
        write!(f, "scalar(")?;
        let mut parts = Vec::new();
        if self.smin != i64::MIN {
            parts.push(format!("smin={}", self.smin));
        }
        if self.smax != i64::MAX {
            parts.push(format!("smax={}", self.smax));
        }
        if self.umin != 0 {
            parts.push(format!("umin={}", self.umin));
        }
        if self.umax != u64::MAX {
            parts.push(format!("umax={}", self.umax));
        }
        if self.tnum.mask != u64::MAX && !parts.is_empty() {
            parts.push(format!(
                "var_off=(0x{:x}; 0x{:x})",
                self.tnum.value, self.tnum.mask
            ));
        }
        write!(f, "{})", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn and_mask_bounds_the_range() {
        let r = Scalar::UNKNOWN.and(&Scalar::konst(0xff));
        assert_eq!((r.umin, r.umax, r.smin, r.smax), (0, 255, 0, 255));
    }

    #[test]
    fn refinement_on_unsigned_less_than() {
        let (a, _) = Scalar::UNKNOWN.refine(&Scalar::konst(10), Cmp::Lt).unwrap();
        assert_eq!((a.umin, a.umax), (0, 9));
        assert!(Scalar::konst(5)
            .refine(&Scalar::konst(3), Cmp::Lt)
            .is_none());
    }

    #[test]
    fn ne_shaves_an_end() {
        let a = Scalar::urange(0, 1);
        let (a, _) = a.refine(&Scalar::konst(0), Cmp::Ne).unwrap();
        assert_eq!(a.as_const(), Some(1));
    }

    #[test]
    fn tnum_mul_of_consts_and_ranges() {
        assert_eq!(Tnum::konst(6).times(Tnum::konst(7)), Tnum::konst(42));
        let r = Scalar::urange(0, 3).mul(&Scalar::konst(4));
        assert_eq!((r.umin, r.umax), (0, 12));
    }

    #[test]
    fn sext_of_negative_byte() {
        assert_eq!(Scalar::konst(0xff).sext(1).as_const(), Some(u64::MAX));
    }
}
