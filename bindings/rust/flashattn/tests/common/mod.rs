//! Helpers shared by the integration tests.
// Each test crate includes this module and uses a part of it.
#![allow(dead_code)]

/// Deterministic pseudo-random values in [-1, 1).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn max_err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(&x, &y)| if x as f64 == y { 0.0 } else { (x as f64 - y).abs() }).fold(0.0, f64::max)
}
