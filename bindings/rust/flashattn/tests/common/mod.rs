//! Helpers shared by the integration tests.
// Each test crate includes this module and uses a part of it.
#![allow(dead_code)]

use flashattn::{Element, Grads, Inputs, Plan, Shape};

/// The outputs of one forward and backward: O, LSE, dQ, dK, dV.
pub struct FwdBwd<T> {
    pub out: Vec<T>,
    pub lse: Vec<f32>,
    pub dq: Vec<T>,
    pub dk: Vec<T>,
    pub dv: Vec<T>,
}

/// A forward of `plan` and the backward of `dout` through it, no optional inputs; O starts
/// as `unset` and LSE as NaN (so a value the run left unwritten shows), the gradients as `zero`.
pub fn forward_backward<T: Element>(
    plan: &Plan,
    shape: Shape,
    [q, k, v, dout]: [&[T]; 4],
    unset: T,
    zero: T,
) -> FwdBwd<T> {
    let mut out = vec![unset; shape.o_len()];
    let mut lse = vec![f32::NAN; shape.lse_len()];
    plan.forward(q, k, v, &mut out, Some(&mut lse), &Inputs::default()).unwrap();
    let (mut dq, mut dk, mut dv) = (vec![zero; q.len()], vec![zero; k.len()], vec![zero; v.len()]);
    plan.backward(
        q,
        k,
        v,
        &out,
        &lse,
        dout,
        Grads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dbias: None },
        &Inputs::default(),
    )
    .unwrap();
    FwdBwd { out, lse, dq, dk, dv }
}

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
