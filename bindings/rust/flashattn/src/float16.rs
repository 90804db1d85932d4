//! Minimal 16-bit float storage types: [`F16`] (IEEE binary16) and [`Bf16`] (bfloat16).
//!
//! They only store bits and convert to and from `f32` (round to nearest, ties to even);
//! the library does the arithmetic in fp32. With the cargo feature `half` they convert
//! losslessly (bit for bit) to and from the `half` crate's `f16` and `bf16`.

/// IEEE 754 binary16, stored as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16 (the upper half of an f32), stored as its bits.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl F16 {
    /// From raw bits.
    pub const fn from_bits(bits: u16) -> Self {
        F16(bits)
    }

    /// The raw bits.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// Nearest binary16 value (ties to even); overflow gives infinity, NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32;
        let man = b & 0x7f_ffff;
        if exp == 0xff {
            let nan = if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
            return F16(sign | 0x7c00 | nan);
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        if e <= 0 {
            if e < -10 {
                return F16(sign);
            }
            let m = man | 0x80_0000;
            let shift = (14 - e) as u32;
            let half = 1u32 << (shift - 1);
            let rem = m & ((1u32 << shift) - 1);
            let mut r = m >> shift;
            if rem > half || (rem == half && (r & 1) == 1) {
                r += 1;
            }
            return F16(sign | r as u16);
        }
        let mut r = ((e as u32) << 10) | (man >> 13);
        let rem = man & 0x1fff;
        if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
            r += 1; // a carry into the exponent is the correct rounding (up to infinity)
        }
        F16(sign | r as u16)
    }

    /// Exact conversion to f32.
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x3ff;
        if exp == 0 {
            let v = man as f32 * (1.0 / 16_777_216.0); // man * 2^-24
            return if sign != 0 { -v } else { v };
        }
        if exp == 0x1f {
            return f32::from_bits(sign | 0x7f80_0000 | (man << 13));
        }
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
    }
}

impl Bf16 {
    /// From raw bits.
    pub const fn from_bits(bits: u16) -> Self {
        Bf16(bits)
    }

    /// The raw bits.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// Nearest bfloat16 value (ties to even); NaN stays NaN.
    pub fn from_f32(x: f32) -> Self {
        let b = x.to_bits();
        if x.is_nan() {
            return Bf16(((b >> 16) as u16) | 0x40);
        }
        Bf16(((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16)
    }

    /// Exact conversion to f32.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl From<f32> for F16 {
    fn from(x: f32) -> Self {
        F16::from_f32(x)
    }
}

impl From<F16> for f32 {
    fn from(x: F16) -> f32 {
        x.to_f32()
    }
}

impl From<f32> for Bf16 {
    fn from(x: f32) -> Self {
        Bf16::from_f32(x)
    }
}

impl From<Bf16> for f32 {
    fn from(x: Bf16) -> f32 {
        x.to_f32()
    }
}

#[cfg(feature = "half")]
impl From<::half::f16> for F16 {
    fn from(x: ::half::f16) -> Self {
        F16(x.to_bits())
    }
}

#[cfg(feature = "half")]
impl From<F16> for ::half::f16 {
    fn from(x: F16) -> Self {
        ::half::f16::from_bits(x.0)
    }
}

#[cfg(feature = "half")]
impl From<::half::bf16> for Bf16 {
    fn from(x: ::half::bf16) -> Self {
        Bf16(x.to_bits())
    }
}

#[cfg(feature = "half")]
impl From<Bf16> for ::half::bf16 {
    fn from(x: Bf16) -> Self {
        ::half::bf16::from_bits(x.0)
    }
}

impl core::fmt::Debug for F16 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}f16", self.to_f32())
    }
}

impl core::fmt::Debug for Bf16 {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}bf16", self.to_f32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_known_values() {
        assert_eq!(F16::from_f32(1.0).0, 0x3c00);
        assert_eq!(F16::from_f32(-2.0).0, 0xc000);
        assert_eq!(F16::from_f32(65504.0).0, 0x7bff);
        assert_eq!(F16::from_f32(65520.0).0, 0x7c00); // rounds up to infinity
        assert_eq!(F16::from_f32(5.960_464_5e-8).0, 0x0001); // smallest subnormal
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).0, 0x3c00); // tie to even
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0).0, 0x3c02);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn f16_round_trips_every_finite_value() {
        for bits in 0u16..=0xffff {
            let h = F16(bits);
            let x = h.to_f32();
            if x.is_nan() {
                continue;
            }
            assert_eq!(F16::from_f32(x).0, bits, "bits {bits:#x}");
        }
    }

    #[test]
    fn bf16_values() {
        assert_eq!(Bf16::from_f32(1.0).0, 0x3f80);
        assert_eq!(Bf16::from_f32(-3.0).to_f32(), -3.0);
        assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).0, 0x3f80); // tie to even
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    }
}
