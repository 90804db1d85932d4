//! Causal GQA attention forward and backward on the CPU backend.
//!
//! Run: FLASHATTN_LIB_DIR=<dir with libflashattn.so> cargo run --example forward, or for an
//! installed library PKG_CONFIG_PATH=<prefix>/lib/pkgconfig cargo run --example forward (the
//! run path flashattn's build.rs embeds loads the same library; README.md: Linking and running).
use flashattn::{Align, DType, Grads, Inputs, Plan, Shape};

fn main() -> Result<(), flashattn::Error> {
    let (major, minor, patch) = flashattn::version();
    println!("libflashattn {major}.{minor}.{patch}, CUDA backend built: {}", flashattn::has_cuda_backend());

    // batch 2, 64 queries, 64 keys, 8 query heads sharing 2 key/value heads, head dim 32.
    let shape = Shape::new(2, 64, 64, 8, 2, 32);
    let mut plan = Plan::cpu(shape, DType::F32)?;
    plan.set_causal(Align::TopLeft)?.set_softcap(30.0)?;

    let fill = |n: usize, a: f32| (0..n).map(|i| ((i as f32) * a).sin()).collect::<Vec<f32>>();
    let (q, k, v) = (fill(shape.q_len(), 0.37), fill(shape.k_len(), 0.11), fill(shape.v_len(), 0.07));
    let mut out = vec![0f32; shape.o_len()];
    let mut lse = vec![0f32; shape.lse_len()];
    plan.forward(&q, &k, &v, &mut out, Some(&mut lse), &Inputs::default())?;

    let dout = vec![1f32; shape.o_len()];
    let (mut dq, mut dk, mut dv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
    plan.backward(
        &q,
        &k,
        &v,
        &out,
        &lse,
        &dout,
        Grads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dbias: None },
        &Inputs::default(),
    )?;

    let norm = |x: &[f32]| x.iter().map(|v| v * v).sum::<f32>().sqrt();
    println!(
        "|out| = {:.4}  lse[0] = {:.4}  |dq| = {:.4}  |dk| = {:.4}  |dv| = {:.4}",
        norm(&out),
        lse[0],
        norm(&dq),
        norm(&dk),
        norm(&dv)
    );

    // Errors carry the status and the library's message.
    match Plan::cpu(Shape::new(1, 8, 8, 2, 2, 300), DType::F32) {
        Err(e) => println!("expected error: {e}"),
        Ok(_) => unreachable!("head_dim 300 is above the maximum"),
    }
    Ok(())
}
