//! Real forward and backward calls on the CPU backend, checked against a small f64
//! reference written from the header's semantics (scale, causal/bottom-right band mask,
//! GQA, fully masked rows).
use flashattn::{
    Align, Backend, BiasKind, BlockSparse, DType, Error, Inputs, Pass, Plan, Shape, Status, TensorId, F16,
};

mod common;
use common::{data, forward_backward, max_err, FwdBwd};

struct RefOut {
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// Contiguous BSHD reference with optional causal mask (alignment) and softmax scale.
fn reference(s: Shape, q: &[f32], k: &[f32], v: &[f32], dout: &[f32], causal: Option<Align>, scale: f64) -> RefOut {
    let (b_, sq, sk, hq, hkv, d, dv_) = (
        s.batch as usize,
        s.seqlen_q as usize,
        s.seqlen_k as usize,
        s.heads_q as usize,
        s.heads_kv as usize,
        s.head_dim_qk as usize,
        s.head_dim_v as usize,
    );
    let qi = |b: usize, i: usize, h: usize, x: usize| ((b * sq + i) * hq + h) * d + x;
    let ki = |b: usize, j: usize, h: usize, x: usize| ((b * sk + j) * hkv + h) * d + x;
    let vi = |b: usize, j: usize, h: usize, x: usize| ((b * sk + j) * hkv + h) * dv_ + x;
    let oi = |b: usize, i: usize, h: usize, x: usize| ((b * sq + i) * hq + h) * dv_ + x;
    let mut r = RefOut {
        o: vec![0.0; b_ * sq * hq * dv_],
        lse: vec![0.0; b_ * hq * sq],
        dq: vec![0.0; q.len()],
        dk: vec![0.0; k.len()],
        dv: vec![0.0; v.len()],
    };
    for b in 0..b_ {
        for h in 0..hq {
            let hk = h / (hq / hkv);
            for i in 0..sq {
                let shift = match causal {
                    Some(Align::BottomRight) => sk as i64 - sq as i64,
                    _ => 0,
                };
                let keep = |j: usize| causal.is_none() || (j as i64) <= i as i64 + shift;
                let mut sc = vec![f64::NEG_INFINITY; sk];
                for (j, sj) in sc.iter_mut().enumerate() {
                    if keep(j) {
                        *sj = scale * (0..d).map(|x| q[qi(b, i, h, x)] as f64 * k[ki(b, j, hk, x)] as f64).sum::<f64>();
                    }
                }
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    r.lse[(b * hq + h) * sq + i] = f64::NEG_INFINITY;
                    continue;
                }
                let l: f64 = sc.iter().map(|&x| (x - m).exp()).sum();
                let p: Vec<f64> = sc.iter().map(|&x| (x - m).exp() / l).collect();
                r.lse[(b * hq + h) * sq + i] = m + l.ln();
                for x in 0..dv_ {
                    r.o[oi(b, i, h, x)] = (0..sk).map(|j| p[j] * v[vi(b, j, hk, x)] as f64).sum();
                }
                // backward
                let dp: Vec<f64> = (0..sk)
                    .map(|j| (0..dv_).map(|x| dout[oi(b, i, h, x)] as f64 * v[vi(b, j, hk, x)] as f64).sum())
                    .collect();
                let delta: f64 = (0..sk).map(|j| p[j] * dp[j]).sum();
                for j in 0..sk {
                    let ds = p[j] * (dp[j] - delta);
                    for x in 0..dv_ {
                        r.dv[vi(b, j, hk, x)] += p[j] * dout[oi(b, i, h, x)] as f64;
                    }
                    for x in 0..d {
                        r.dq[qi(b, i, h, x)] += scale * ds * k[ki(b, j, hk, x)] as f64;
                        r.dk[ki(b, j, hk, x)] += scale * ds * q[qi(b, i, h, x)] as f64;
                    }
                }
            }
        }
    }
    r
}

fn run_case(shape: Shape, causal: Option<Align>, scale: Option<f32>) {
    let mut plan = Plan::cpu(shape, DType::F32).unwrap();
    if let Some(a) = causal {
        plan.set_causal(a).unwrap();
    }
    if let Some(sc) = scale {
        plan.set_scale(sc).unwrap();
    }
    let q = data(shape.q_len(), 1);
    let k = data(shape.k_len(), 2);
    let v = data(shape.v_len(), 3);
    let dout = data(shape.o_len(), 4);
    let FwdBwd { out, lse, dq, dk, dv } = forward_backward(&plan, shape, [&q, &k, &v, &dout], f32::NAN, 0.0);
    let sc = scale.map(|x| x as f64).unwrap_or(1.0 / (shape.head_dim_qk as f64).sqrt());
    let r = reference(shape, &q, &k, &v, &dout, causal, sc);
    assert!(max_err(&out, &r.o) < 2e-5, "out {}", max_err(&out, &r.o));
    assert!(max_err(&lse, &r.lse) < 2e-5, "lse {}", max_err(&lse, &r.lse));
    assert!(max_err(&dq, &r.dq) < 1e-4, "dq {}", max_err(&dq, &r.dq));
    assert!(max_err(&dk, &r.dk) < 1e-4, "dk {}", max_err(&dk, &r.dk));
    assert!(max_err(&dv, &r.dv) < 1e-4, "dv {}", max_err(&dv, &r.dv));
}

#[test]
fn forward_backward_mha() {
    run_case(Shape::new(2, 17, 23, 3, 3, 16), None, None);
}

#[test]
fn grad_accumulate_adds_the_gradients_to_dq_dk_dv() {
    // fp32: the accumulated gradient is the f32 sum of the start value and the plain run's.
    let shape = Shape::new(2, 9, 13, 4, 2, 8).with_head_dim_v(12);
    let mut plan = Plan::cpu(shape, DType::F32).unwrap();
    plan.set_causal(Align::BottomRight).unwrap();
    let inputs = [data(shape.q_len(), 5), data(shape.k_len(), 6), data(shape.v_len(), 7), data(shape.o_len(), 8)];
    let [q, k, v, dout] = [&inputs[0][..], &inputs[1][..], &inputs[2][..], &inputs[3][..]];
    let plain = forward_backward(&plan, shape, [q, k, v, dout], f32::NAN, 0.0);
    plan.set_grad_accumulate(true).unwrap();
    let acc = forward_backward(&plan, shape, [q, k, v, dout], f32::NAN, 0.75);
    for (got, base) in [(&acc.dq, &plain.dq), (&acc.dk, &plain.dk), (&acc.dv, &plain.dv)] {
        assert!(got.iter().zip(base.iter()).all(|(&a, &b)| a == 0.75 + b));
    }
    plan.set_grad_accumulate(false).unwrap();
    let again = forward_backward(&plan, shape, [q, k, v, dout], f32::NAN, 0.75);
    assert_eq!(again.dq, plain.dq);
}

#[test]
fn forward_backward_gqa_causal_with_scale() {
    run_case(Shape::new(1, 21, 21, 4, 2, 8).with_head_dim_v(12), Some(Align::TopLeft), Some(0.37));
}

#[test]
fn forward_backward_mqa_bottom_right_fully_masked_rows() {
    // seqlen_q > seqlen_k with bottom-right alignment: the first 5 rows see no key.
    let shape = Shape::new(1, 12, 7, 2, 1, 8);
    run_case(shape, Some(Align::BottomRight), None);
    let plan = {
        let mut p = Plan::cpu(shape, DType::F32).unwrap();
        p.set_causal(Align::BottomRight).unwrap();
        p
    };
    let q = data(shape.q_len(), 9);
    let k = data(shape.k_len(), 8);
    let v = data(shape.v_len(), 7);
    let mut out = vec![1f32; shape.o_len()];
    let mut lse = vec![0f32; shape.lse_len()];
    plan.forward(&q, &k, &v, &mut out, Some(&mut lse), &Inputs::default()).unwrap();
    assert!(out[..5 * 2 * 8].iter().all(|&x| x == 0.0));
    assert!(lse[..5].iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn fp16_forward_close_to_fp32() {
    let shape = Shape::new(1, 16, 16, 2, 2, 32);
    let q = data(shape.q_len(), 11);
    let k = data(shape.k_len(), 12);
    let v = data(shape.v_len(), 13);
    let h = |x: &Vec<f32>| x.iter().map(|&y| F16::from_f32(y)).collect::<Vec<_>>();
    let (qh, kh, vh) = (h(&q), h(&k), h(&v));
    let back = |x: &Vec<F16>| x.iter().map(|y| y.to_f32()).collect::<Vec<_>>();
    let plan = Plan::cpu(shape, DType::F16).unwrap();
    let mut out = vec![F16::default(); shape.o_len()];
    plan.forward(&qh, &kh, &vh, &mut out, None, &Inputs::default()).unwrap();
    let r = reference(shape, &back(&qh), &back(&kh), &back(&vh), &vec![0.0; shape.o_len()], None, 1.0 / 32f64.sqrt());
    let outf: Vec<f32> = out.iter().map(|x| x.to_f32()).collect();
    assert!(max_err(&outf, &r.o) < 2e-3, "{}", max_err(&outf, &r.o));
}

#[test]
fn bias_tensor_block_sparse_and_varlen_run() {
    // Bias that is -inf-free but large pushes all mass to key 0; checks bias is applied.
    let shape = Shape::new(1, 4, 6, 1, 1, 4);
    let mut plan = Plan::cpu(shape, DType::F32).unwrap();
    plan.set_bias(BiasKind::Tensor([0, 0, 6, 1])).unwrap();
    let q = data(shape.q_len(), 21);
    let k = data(shape.k_len(), 22);
    let v = data(shape.v_len(), 23);
    let mut bias = vec![0f32; 4 * 6];
    for i in 0..4 {
        bias[i * 6] = 60.0;
    }
    let mut out = vec![0f32; shape.o_len()];
    plan.forward(&q, &k, &v, &mut out, None, &Inputs { bias: Some(&bias), ..Default::default() }).unwrap();
    for i in 0..4 {
        for x in 0..4 {
            assert!((out[i * 4 + x] - v[x]).abs() < 1e-5);
        }
    }
    // Block-sparse: only the first key block (keys 0..2) is visible.
    let mut plan = Plan::cpu(shape, DType::F32).unwrap();
    let layout = [1u8, 0, 0];
    plan.set_block_sparse(Some(BlockSparse {
        layout: &layout,
        layout_heads: 1,
        num_row_blocks: 1,
        num_col_blocks: 3,
        block_q: 4,
        block_k: 2,
    }))
    .unwrap();
    let mut sparse = vec![0f32; shape.o_len()];
    plan.forward(&q, &k, &v, &mut sparse, None, &Inputs::default()).unwrap();
    let small = Shape::new(1, 4, 2, 1, 1, 4);
    let r = reference(small, &q, &k[..8], &v[..8], &[0.0; 16], None, 0.5);
    assert!(max_err(&sparse, &r.o) < 2e-5);
    // Varlen: two packed sequences of (2 q, 3 k) and (2 q, 3 k) equal two dense batches.
    let mut vl = Plan::cpu(Shape::new(2, 2, 3, 1, 1, 4), DType::F32).unwrap();
    vl.set_varlen(Some((4, 6))).unwrap();
    let (cq, ck) = ([0i32, 2, 4], [0i32, 3, 6]);
    let mut packed = vec![0f32; 16];
    let inputs = Inputs { cu_seqlens_q: Some(&cq), cu_seqlens_k: Some(&ck), ..Default::default() };
    vl.forward(&q[..16], &k[..24], &v[..24], &mut packed, None, &inputs).unwrap();
    let dense = Shape::new(2, 2, 3, 1, 1, 4);
    let r = reference(dense, &q[..16], &k[..24], &v[..24], &[0.0; 16], None, 0.5);
    assert!(max_err(&packed, &r.o) < 2e-5);
}

#[test]
fn errors_carry_status_and_message() {
    let e: Error = Plan::new(Backend::Cpu, 0, Shape::new(1, 8, 8, 2, 2, 300)).unwrap_err();
    assert_eq!(e.status, Status::INVALID_SHAPE);
    assert_eq!(e.status.0, 102);
    assert_eq!(e.status.name(), "FLASHATTN_STATUS_INVALID_SHAPE");
    assert!(e.message.contains("head_dim_qk"), "{}", e.message);
    assert_eq!(e.function, "flashattn_plan_set_shape");
    assert!(e.to_string().contains("head_dim_qk"));

    let e = Plan::new(Backend::Cpu, 0, Shape::new(1, 8, 8, 3, 2, 8)).unwrap_err();
    assert_eq!(e.status, Status::INVALID_HEADS);

    let mut plan = Plan::cpu(Shape::new(1, 8, 8, 2, 2, 8), DType::F32).unwrap();
    let e = plan.set_dropout(1.5, 0, 0).unwrap_err();
    assert_eq!(e.status, Status::INVALID_VALUE);
    assert!(e.message.contains('p'));
    let e = plan.set_strides(TensorId::Q, [1, 2, 3, 4]).unwrap_err();
    assert_eq!(e.status, Status::INVALID_STRIDE);
    assert_eq!(plan.strides(TensorId::Q), [128, 16, 8, 1]); // unchanged

    // Wrapper checks: slice too short, wrong element type; nothing is written.
    let q = vec![0f32; 128];
    let mut out = vec![5f32; 127];
    let e = plan.forward(&q, &q, &q, &mut out, None, &Inputs::default()).unwrap_err();
    assert_eq!(e.status, Status::INVALID_SHAPE);
    assert!(e.message.contains("out"), "{}", e.message);
    assert!(out.iter().all(|&x| x == 5.0));
    let qh = vec![F16::default(); 128];
    let mut oh = vec![F16::default(); 128];
    let e = plan.forward(&qh, &qh, &qh, &mut oh, None, &Inputs::default()).unwrap_err();
    assert_eq!(e.status, Status::INVALID_ARGUMENT);

    // Library check at run time: non-monotonic offsets.
    let mut vl = Plan::cpu(Shape::new(2, 4, 4, 1, 1, 4), DType::F32).unwrap();
    vl.set_varlen(Some((6, 6))).unwrap();
    let x = vec![0.5f32; 24];
    let mut o = vec![9f32; 24];
    let bad = [0i32, 5, 3];
    let e = vl
        .forward(
            &x,
            &x,
            &x,
            &mut o,
            None,
            &Inputs { cu_seqlens_q: Some(&bad), cu_seqlens_k: Some(&bad), ..Default::default() },
        )
        .unwrap_err();
    assert_eq!(e.status, Status::INVALID_SEQLENS);
    assert!(e.message.contains("cu_seqlens"), "{}", e.message);
    assert_eq!(e.function, "flashattn_fwd");
    assert!(o.iter().all(|&x| x == 9.0));
}

#[test]
fn plan_info_and_workspace() {
    let (major, minor, _) = flashattn::version();
    assert_eq!(major, flashattn::sys::FLASHATTN_VERSION_MAJOR);
    assert!(minor >= flashattn::sys::FLASHATTN_VERSION_MINOR);
    let plan = Plan::new(Backend::Auto, 0, Shape::new(1, 8, 8, 2, 2, 8)).unwrap();
    assert!(plan.backend() == Backend::Cpu || flashattn::has_cuda_backend());
    assert!(plan.workspace_size(Pass::Forward).is_ok());
    assert!(plan.workspace_size(Pass::Backward).is_ok());
    if !flashattn::has_cuda_backend() {
        let e = Plan::new(Backend::Cuda, 0, Shape::new(1, 8, 8, 2, 2, 8)).unwrap_err();
        assert_eq!(e.status, Status::BACKEND_UNAVAILABLE);
    }
}

#[test]
fn plan_is_shared_between_threads() {
    let shape = Shape::new(1, 32, 32, 2, 2, 16);
    let mut plan = Plan::cpu(shape, DType::F32).unwrap();
    plan.set_causal(Align::TopLeft).unwrap();
    let q = data(shape.q_len(), 31);
    let mut expect = vec![0f32; shape.o_len()];
    plan.forward(&q, &q, &q, &mut expect, None, &Inputs::default()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let mut o = vec![0f32; shape.o_len()];
                plan.forward(&q, &q, &q, &mut o, None, &Inputs::default()).unwrap();
                assert_eq!(o, expect);
            });
        }
    });
}

#[test]
fn dropout_is_reproducible_and_keyed_by_offset() {
    let shape = Shape::new(1, 16, 32, 2, 2, 8);
    let q = data(shape.q_len(), 41);
    let k = data(shape.k_len(), 42);
    let v = data(shape.v_len(), 43);
    let run = |p: f32, seed: u64, offset: u64| {
        let mut plan = Plan::cpu(shape, DType::F32).unwrap();
        plan.set_dropout(p, seed, offset).unwrap();
        let mut out = vec![0f32; shape.o_len()];
        plan.forward(&q, &k, &v, &mut out, None, &Inputs::default()).unwrap();
        out
    };
    let a = run(0.3, 9, 0);
    assert_eq!(a, run(0.3, 9, 0));
    assert_ne!(a, run(0.3, 9, 4));
    assert_ne!(a, run(0.3, 10, 0));
    let plain = run(0.0, 9, 0);
    let r = reference(shape, &q, &k, &v, &vec![0.0; shape.o_len()], None, 1.0 / 8f64.sqrt());
    assert!(max_err(&plain, &r.o) < 2e-5);
    assert_ne!(a, plain);
}

#[test]
fn alibi_slopes_per_batch_and_head() {
    // q = 0, so the scores are the ALiBi bias alone: slope[b, h] * j (top-left, one query row).
    let shape = Shape::new(2, 1, 3, 2, 2, 4);
    let mut plan = Plan::cpu(shape, DType::F32).unwrap();
    plan.set_bias(BiasKind::Alibi).unwrap().set_alibi_batch_stride(3).unwrap();
    let q = vec![0f32; shape.q_len()];
    let k = data(shape.k_len(), 31);
    let v = data(shape.v_len(), 32);
    let slopes = [0.5f32, -1.0, f32::NAN, 2.0, 0.25]; // rows 3 apart; slopes[2] is never read
    let mut out = vec![0f32; shape.o_len()];
    plan.forward(&q, &k, &v, &mut out, None, &Inputs { alibi_slopes: Some(&slopes), ..Default::default() }).unwrap();
    for b in 0..2 {
        for h in 0..2 {
            let s = slopes[b * 3 + h] as f64;
            let w: Vec<f64> = (0..3).map(|j| (s * j as f64).exp()).collect();
            let sum: f64 = w.iter().sum();
            for x in 0..4 {
                let want: f64 = (0..3).map(|j| w[j] / sum * v[((b * 3 + j) * 2 + h) * 4 + x] as f64).sum();
                assert!((out[(b * 2 + h) * 4 + x] as f64 - want).abs() < 1e-5, "b={b} h={h} x={x}");
            }
        }
    }
    // Too short for two rows 3 apart: refused by the wrapper before the call.
    let e =
        plan.forward(&q, &k, &v, &mut out, None, &Inputs { alibi_slopes: Some(&slopes[..4]), ..Default::default() });
    assert_eq!(e.unwrap_err().status, Status::INVALID_SHAPE);
    assert_eq!(plan.set_alibi_batch_stride(-1).unwrap_err().status, Status::INVALID_STRIDE);
}
