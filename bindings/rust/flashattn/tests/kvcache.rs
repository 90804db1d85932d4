//! KV-cache runs and combine on the CPU backend: decode and chunked prefill with append and
//! rotary against an f64 reference written from docs/inference.md, a paged cache against the
//! same data kept contiguous, the merge of two key halves against the unsplit forward, and
//! bad input (a specific status, the caches untouched).
use flashattn::{
    combine, Align, CombineShape, DType, Inputs, KvCacheConfig, KvCacheRun, Plan, Rotary, RotaryConfig, Shape, Status,
};

mod common;
use common::{data, max_err};

const B: usize = 3;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 8;
const CAP: usize = 12; // keys one sequence may hold
const SQ: usize = 2; // new query tokens = appended tokens per sequence
const ROT: usize = 6; // rotary dims (of D)

/// Contiguous-cache inputs: q, k_cache, v_cache, k_new, v_new, cos, sin, used lengths.
struct Case {
    q: Vec<f32>,
    k_cache: Vec<f32>,
    v_cache: Vec<f32>,
    k_new: Vec<f32>,
    v_new: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    lens: Vec<i32>,
}

fn case() -> Case {
    let rows = CAP; // rotary table rows (positions 0..CAP-1)
    let angle = |p: usize, i: usize| p as f32 * 0.3f32.powf(i as f32 / (ROT / 2) as f32);
    Case {
        q: data(B * SQ * HQ * D, 1),
        k_cache: data(B * CAP * HKV * D, 2),
        v_cache: data(B * CAP * HKV * D, 3),
        k_new: data(B * SQ * HKV * D, 4),
        v_new: data(B * SQ * HKV * D, 5),
        cos: (0..rows * ROT / 2).map(|x| angle(x / (ROT / 2), x % (ROT / 2)).cos()).collect(),
        sin: (0..rows * ROT / 2).map(|x| angle(x / (ROT / 2), x % (ROT / 2)).sin()).collect(),
        lens: vec![0, 5, (CAP - SQ) as i32], // empty, partial, full after the append
    }
}

/// `x` (D values) rotated at position `p` in the half-split (GPT-NeoX) form.
fn rotate_half(x: &[f64], c: &Case, p: usize) -> Vec<f64> {
    let mut y = x.to_vec();
    for i in 0..ROT / 2 {
        let (co, si) = (c.cos[p * ROT / 2 + i] as f64, c.sin[p * ROT / 2 + i] as f64);
        y[i] = x[i] * co - x[i + ROT / 2] * si;
        y[i + ROT / 2] = x[i] * si + x[i + ROT / 2] * co;
    }
    y
}

/// (out [B, SQ, HQ, D], k_cache after the append) of a causal run with half-split rotary.
fn reference(c: &Case) -> (Vec<f64>, Vec<f64>) {
    let mut kc: Vec<f64> = c.k_cache.iter().map(|&x| x as f64).collect();
    let mut vc: Vec<f64> = c.v_cache.iter().map(|&x| x as f64).collect();
    let row = |b: usize, j: usize, h: usize| ((b * CAP + j) * HKV + h) * D;
    let mut out = vec![0.0; B * SQ * HQ * D];
    for b in 0..B {
        let l = c.lens[b] as usize;
        for t in 0..SQ {
            for h in 0..HKV {
                let src = ((b * SQ + t) * HKV + h) * D;
                let kn: Vec<f64> = c.k_new[src..src + D].iter().map(|&x| x as f64).collect();
                kc[row(b, l + t, h)..row(b, l + t, h) + D].copy_from_slice(&rotate_half(&kn, c, l + t));
                for x in 0..D {
                    vc[row(b, l + t, h) + x] = c.v_new[src + x] as f64;
                }
            }
        }
        let n = l + SQ;
        for i in 0..SQ {
            for h in 0..HQ {
                let qs = ((b * SQ + i) * HQ + h) * D;
                let qv: Vec<f64> = c.q[qs..qs + D].iter().map(|&x| x as f64).collect();
                let qr = rotate_half(&qv, c, l + i); // causal: row i at position l + i
                let hk = h / (HQ / HKV);
                let last = i + n - SQ; // bottom-right causal
                let s: Vec<f64> = (0..=last)
                    .map(|j| (0..D).map(|x| qr[x] * kc[row(b, j, hk) + x]).sum::<f64>() / (D as f64).sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let l_sum: f64 = s.iter().map(|&v| (v - m).exp()).sum();
                for x in 0..D {
                    out[qs + x] = (0..=last).map(|j| (s[j] - m).exp() / l_sum * vc[row(b, j, hk) + x]).sum();
                }
            }
        }
    }
    (out, kc)
}

fn plan(config: &KvCacheConfig) -> Plan {
    let mut p =
        Plan::cpu(Shape::new(B as i64, SQ as i64, CAP as i64, HQ as i64, HKV as i64, D as i64), DType::F32).unwrap();
    p.set_causal(Align::BottomRight).unwrap();
    p.set_kvcache(Some(config)).unwrap();
    p
}

fn contiguous_config() -> KvCacheConfig {
    KvCacheConfig {
        num_rows: B as i64,
        seqlen_new: SQ as i64,
        rotary: Some(RotaryConfig { form: Rotary::Half, dim: ROT as i64, rows: CAP as i64 }),
        ..Default::default()
    }
}

fn run<'a>(c: &'a Case, k_cache: &'a mut [f32], v_cache: &'a mut [f32]) -> KvCacheRun<'a, f32> {
    KvCacheRun {
        q: &c.q,
        k_cache,
        v_cache,
        cache_seqlens: &c.lens,
        cache_batch_idx: None,
        block_table: None,
        k_new: Some(&c.k_new),
        v_new: Some(&c.v_new),
        rotary_cos: Some(&c.cos),
        rotary_sin: Some(&c.sin),
        alibi_slopes: None,
    }
}

#[test]
fn chunked_prefill_with_append_and_rotary_matches_reference() {
    let c = case();
    let (want, want_k) = reference(&c);
    for splits in [0, 1, 3] {
        let p = plan(&KvCacheConfig { num_splits: splits, ..contiguous_config() });
        let (mut kc, mut vc) = (c.k_cache.clone(), c.v_cache.clone());
        let mut out = vec![f32::NAN; B * SQ * HQ * D];
        let mut lse = vec![f32::NAN; B * HQ * SQ];
        p.forward_kvcache(run(&c, &mut kc, &mut vc), &mut out, Some(&mut lse)).unwrap();
        assert!(max_err(&out, &want) < 2e-5, "splits {splits}: out {}", max_err(&out, &want));
        assert!(max_err(&kc, &want_k) < 2e-6, "splits {splits}: k_cache {}", max_err(&kc, &want_k));
        assert!(lse.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn paged_cache_with_page_size_3_equals_the_contiguous_cache() {
    let c = case();
    let (page, per_seq) = (3usize, CAP / 3);
    let pool = B * per_seq + 2;
    // Sequence b's logical page g lives in pool page table[b][g], a scattered permutation.
    let table: Vec<i32> = (0..B * per_seq).map(|x| ((x * 5 + 3) % pool) as i32).collect();
    let (mut kp, mut vp) = (data(pool * page * HKV * D, 8), data(pool * page * HKV * D, 9));
    let tok = |b: usize, j: usize| (table[b * per_seq + j / page] as usize * page + j % page) * HKV * D;
    for b in 0..B {
        for j in 0..CAP {
            let src = (b * CAP + j) * HKV * D;
            kp[tok(b, j)..tok(b, j) + HKV * D].copy_from_slice(&c.k_cache[src..src + HKV * D]);
            vp[tok(b, j)..tok(b, j) + HKV * D].copy_from_slice(&c.v_cache[src..src + HKV * D]);
        }
    }
    let p = plan(&KvCacheConfig {
        page_size: page as i64,
        num_rows: pool as i64,
        max_pages_per_seq: per_seq as i64,
        ..contiguous_config()
    });
    let mut out = vec![f32::NAN; B * SQ * HQ * D];
    let mut r = run(&c, &mut kp, &mut vp);
    r.block_table = Some(&table);
    p.forward_kvcache(r, &mut out, None).unwrap();
    let (want, want_k) = reference(&c);
    assert!(max_err(&out, &want) < 2e-5, "out {}", max_err(&out, &want));
    for b in 0..B {
        for j in 0..CAP {
            let src = (b * CAP + j) * HKV * D;
            assert!(max_err(&kp[tok(b, j)..tok(b, j) + HKV * D], &want_k[src..src + HKV * D]) < 2e-6);
        }
    }
}

#[test]
fn combine_of_two_key_halves_equals_the_unsplit_forward() {
    let (b, sq, sk, h, d) = (2usize, 3usize, 10usize, 2usize, 8usize);
    let (q, k, v) = (data(b * sq * h * d, 11), data(b * sk * h * d, 12), data(b * sk * h * d, 13));
    let attend = |keys: std::ops::Range<usize>, o: &mut [f32], lse: &mut [f32]| {
        let n = keys.len();
        let pick = |x: &[f32]| -> Vec<f32> {
            (0..b).flat_map(|bb| x[(bb * sk + keys.start) * h * d..(bb * sk + keys.end) * h * d].to_vec()).collect()
        };
        let p = Plan::cpu(Shape::new(b as i64, sq as i64, n as i64, h as i64, h as i64, d as i64), DType::F32).unwrap();
        p.forward(&q, &pick(&k), &pick(&v), o, Some(lse), &Inputs::default()).unwrap();
    };
    let (mut full, mut full_lse) = (vec![0f32; b * sq * h * d], vec![0f32; b * h * sq]);
    attend(0..sk, &mut full, &mut full_lse);
    // Parts: keys 0..4, keys 4..10, and an empty part (LSE -inf, O never read: NaN here).
    let part = b * sq * h * d;
    let mut o_parts = vec![f32::NAN; 3 * part];
    let mut lse_parts = vec![f32::NEG_INFINITY; 3 * b * h * sq];
    let (o01, _) = o_parts.split_at_mut(2 * part);
    let (o0, o1) = o01.split_at_mut(part);
    let (l01, _) = lse_parts.split_at_mut(2 * b * h * sq);
    let (l0, l1) = l01.split_at_mut(b * h * sq);
    attend(0..4, o0, l0);
    attend(4..sk, o1, l1);
    let shape = CombineShape {
        num_splits: 3,
        batch: b as i64,
        seqlen_q: sq as i64,
        heads: h as i64,
        head_dim: d as i64,
        ..Default::default()
    };
    let (mut o, mut lse) = (vec![f32::NAN; part], vec![f32::NAN; b * h * sq]);
    combine(&shape, &o_parts, &lse_parts, &mut o, Some(&mut lse)).unwrap();
    let wide = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<_>>();
    assert!(max_err(&o, &wide(&full)) < 1e-5, "o {}", max_err(&o, &wide(&full)));
    assert!(max_err(&lse, &wide(&full_lse)) < 1e-5, "lse {}", max_err(&lse, &wide(&full_lse)));

    let short = CombineShape { num_splits: 4, ..shape };
    let e = combine(&short, &o_parts, &lse_parts, &mut o, None).unwrap_err();
    assert_eq!(e.status, Status::INVALID_SHAPE);
    assert!(e.message.contains("o_partial"), "{e}");
}

#[test]
fn bad_input_is_refused_with_the_caches_untouched() {
    let c = case();
    let p = plan(&contiguous_config());
    let mut out = vec![7f32; B * SQ * HQ * D];
    let (mut kc, mut vc) = (c.k_cache.clone(), c.v_cache.clone());

    // A used length that leaves no room for the appended tokens: the library's INVALID_SEQLENS.
    let lens = vec![0, 5, (CAP - SQ + 1) as i32];
    let mut r = run(&c, &mut kc, &mut vc);
    r.cache_seqlens = &lens;
    let e = p.forward_kvcache(r, &mut out, None).unwrap_err();
    assert_eq!(e.status, Status::INVALID_SEQLENS);
    assert!(e.message.contains("cache_seqlens"), "{e}");

    // A slice shorter than the configured cache: the wrapper's INVALID_SHAPE.
    let short = B * CAP * HKV * D - 1;
    let e = p.forward_kvcache(run(&c, &mut kc[..short], &mut vc), &mut out, None).unwrap_err();
    assert_eq!(e.status, Status::INVALID_SHAPE);
    assert!(e.message.contains("k_cache"), "{e}");

    // A block table on a contiguous cache: the library's INCOMPATIBLE_OPTIONS.
    let table = vec![0i32; B];
    let mut r = run(&c, &mut kc, &mut vc);
    r.block_table = Some(&table);
    let e = p.forward_kvcache(r, &mut out, None).unwrap_err();
    assert_eq!(e.status, Status::INCOMPATIBLE_OPTIONS);
    assert!(e.message.contains("block_table"), "{e}");

    assert!(kc == c.k_cache && vc == c.v_cache && out.iter().all(|&x| x == 7.0));

    // Rotary without appended tokens, and leaving KV-cache mode.
    let mut p = plan(&contiguous_config());
    let e = p.set_kvcache(Some(&KvCacheConfig { seqlen_new: 0, ..contiguous_config() })).unwrap_err();
    assert_eq!(e.status, Status::INCOMPATIBLE_OPTIONS);
    assert_eq!(p.kvcache(), Some(&contiguous_config()));
    p.set_kvcache(None).unwrap();
    assert_eq!(p.kvcache(), None);
    let e = p.forward_kvcache(run(&c, &mut kc, &mut vc), &mut out, None).unwrap_err();
    assert_eq!(e.status, Status::PLAN_INCOMPLETE);
}
