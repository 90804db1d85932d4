//! The cargo feature `half`: the half crate's f16 and bf16 as element types of the safe API,
//! run through the CPU backend against fp32, and their conversions to F16 and Bf16.
#![cfg(feature = "half")]
use flashattn::{Bf16, DType, Element, Inputs, Plan, Shape, Status, F16};
use half::{bf16, f16};

mod common;
use common::{data, forward_backward, FwdBwd};

struct Run {
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

/// Causal forward and backward on `dtype` with inputs stored as `T`, read back as f32.
fn run<T: Element>(
    shape: Shape,
    dtype: DType,
    inputs: [&[f32]; 4],
    to: impl Fn(f32) -> T + Copy,
    from: impl Fn(T) -> f32 + Copy,
) -> Run {
    let mut plan = Plan::cpu(shape, dtype).unwrap();
    plan.set_causal(flashattn::Align::BottomRight).unwrap();
    let cast = |x: &[f32]| x.iter().map(|&y| to(y)).collect::<Vec<T>>();
    let back = |x: &[T]| x.iter().map(|&y| from(y)).collect::<Vec<f32>>();
    let (q, k, v, dout) = (cast(inputs[0]), cast(inputs[1]), cast(inputs[2]), cast(inputs[3]));
    let FwdBwd { out, lse, dq, dk, dv } = forward_backward(&plan, shape, [&q, &k, &v, &dout], to(f32::NAN), to(0.0));
    Run { out: back(&out), lse, dq: back(&dq), dk: back(&dk), dv: back(&dv) }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// To a storage type from f32, and back.
type Convert<T> = (fn(f32) -> T, fn(T) -> f32);

/// `T` against fp32 on the same (rounded) inputs: the outputs differ by their own rounding to
/// `T` (`eps`: half an ulp at 1, relative) and the gradients by little more. `U`, flashattn's
/// own 16-bit type for `dtype`, must give the same bits.
fn check<T: Element, U: Element>(dtype: DType, t: Convert<T>, u: Convert<U>, eps: f32) {
    let shape = Shape::new(2, 9, 13, 4, 2, 16);
    let raw = [data(shape.q_len(), 21), data(shape.k_len(), 22), data(shape.v_len(), 23), data(shape.o_len(), 24)];
    let rounded: Vec<Vec<f32>> = raw.iter().map(|x| x.iter().map(|&y| t.1(t.0(y))).collect()).collect();
    let r = [&rounded[0][..], &rounded[1][..], &rounded[2][..], &rounded[3][..]];
    assert!(max_diff(r[0], &raw[0]) > 0.0, "the inputs must not be exact in {dtype:?}");
    let h = run(shape, dtype, r, t.0, t.1);
    let f = run(shape, DType::F32, r, |x| x, |x| x);
    assert!(max_diff(&h.out, &f.out) <= 2.0 * eps, "out {}", max_diff(&h.out, &f.out));
    assert!(max_diff(&h.lse, &f.lse) <= 1e-5, "lse {}", max_diff(&h.lse, &f.lse));
    for (name, a, b) in [("dq", &h.dq, &f.dq), ("dk", &h.dk, &f.dk), ("dv", &h.dv, &f.dv)] {
        let scale = b.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        assert!(max_diff(a, b) <= 4.0 * eps * scale, "{name} {} (max |{name}| {scale})", max_diff(a, b));
    }
    let own = run(shape, dtype, r, u.0, u.1);
    for (name, a, b) in
        [("out", &own.out, &h.out), ("dq", &own.dq, &h.dq), ("dk", &own.dk, &h.dk), ("dv", &own.dv, &h.dv)]
    {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name}: half's type and flashattn's differ");
    }
}

#[test]
fn f16_forward_backward_against_fp32() {
    check(DType::F16, (f16::from_f32, f16::to_f32), (F16::from_f32, F16::to_f32), 1.0 / 2048.0);
}

#[test]
fn bf16_forward_backward_against_fp32() {
    check(DType::Bf16, (bf16::from_f32, bf16::to_f32), (Bf16::from_f32, Bf16::to_f32), 1.0 / 256.0);
}

#[test]
fn element_type_must_match_the_plan() {
    let shape = Shape::new(1, 4, 4, 1, 1, 8);
    let plan = Plan::cpu(shape, DType::F16).unwrap();
    let x = vec![bf16::from_f32(0.5); shape.q_len()];
    let mut out = vec![bf16::from_f32(7.0); shape.o_len()];
    let e = plan.forward(&x, &x, &x, &mut out, None, &Inputs::default()).unwrap_err();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);
    assert!(out.iter().all(|&y| y == bf16::from_f32(7.0)));
    let x = vec![f16::from_f32(0.5); shape.q_len()];
    let mut out = vec![f16::from_f32(7.0); shape.o_len()];
    plan.forward(&x, &x, &x, &mut out, None, &Inputs::default()).unwrap();
    assert!(out.iter().all(|&y| y == f16::from_f32(0.5)), "uniform values average to themselves");
}

#[test]
fn conversions_keep_the_bits_and_agree_on_rounding() {
    for bits in 0u16..=0xffff {
        assert_eq!(F16::from(f16::from_bits(bits)).to_bits(), bits);
        assert_eq!(f16::from(F16::from_bits(bits)).to_bits(), bits);
        assert_eq!(Bf16::from(bf16::from_bits(bits)).to_bits(), bits);
        assert_eq!(bf16::from(Bf16::from_bits(bits)).to_bits(), bits);
    }
    // f32 values at three magnitudes (normal, subnormal and overflowing in f16), and ties:
    // flashattn's conversions round as half's do.
    for x in data(1 << 16, 5).into_iter().chain([1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, 65520.0, 5.960_464_5e-8]) {
        for y in [x, x * 1e-4, x * 1e5] {
            assert_eq!(F16::from_f32(y).to_bits(), f16::from_f32(y).to_bits(), "f16 of {y:e}");
            assert_eq!(Bf16::from_f32(y).to_bits(), bf16::from_f32(y).to_bits(), "bf16 of {y:e}");
        }
    }
}
