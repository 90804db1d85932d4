//! Inference: KV-cache runs ([`Plan::set_kvcache`], [`Plan::forward_kvcache`]) and the merge
//! of partial results ([`combine`]); docs/inference.md is the user guide.
use std::ffi::c_void;
use std::ptr;

use crate::{check, span, sys, wrapper_error, Backend, Element, Pass, Plan, Result, Status, TensorId};

/// Rotary embedding form applied to q and the appended keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rotary {
    /// GPT-NeoX: dims k and k + rotary_dim/2 form a pair (FlashAttention's `rotary_interleaved=False`).
    Half,
    /// GPT-J: dims 2k and 2k+1 form a pair.
    Interleaved,
}

/// Rotary embedding of a KV-cache plan: the form, the leading dims rotated (even) and the
/// rows (positions) of the cos/sin tables.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RotaryConfig {
    pub form: Rotary,
    pub dim: i64,
    pub rows: i64,
}

/// KV-cache geometry of a plan (`flashattn_kvcache_config_t`). The plan's seqlen_q is the
/// new query tokens per sequence, its seqlen_k the capacity of one sequence. Strides are
/// (row or page, token, head, dim) in elements; `None` is contiguous.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct KvCacheConfig {
    /// 0: contiguous cache, one row of seqlen_k tokens per cache row; >= 1: paged pool.
    pub page_size: i64,
    /// Cache rows (contiguous) or pages in the pool (paged).
    pub num_rows: i64,
    /// Paged: block-table columns, >= ceil(seqlen_k / page_size); contiguous: 0.
    pub max_pages_per_seq: i64,
    pub k_cache_strides: Option<[i64; 4]>,
    pub v_cache_strides: Option<[i64; 4]>,
    /// Tokens appended to each sequence before attending (0: none).
    pub seqlen_new: i64,
    pub k_new_strides: Option<[i64; 4]>,
    pub v_new_strides: Option<[i64; 4]>,
    /// Rotary embedding (needs seqlen_new >= 1).
    pub rotary: Option<RotaryConfig>,
    /// Key splits per (sequence, head); 0 lets the library choose.
    pub num_splits: i64,
}

/// The arrays of one KV-cache run on host slices (see `flashattn_kvcache_args_t`).
pub struct KvCacheRun<'a, T> {
    /// Query [batch, seqlen_q, heads_q, head_dim_qk] (plan's Q strides).
    pub q: &'a [T],
    /// K cache; written where new keys are appended.
    pub k_cache: &'a mut [T],
    /// V cache; written where new values are appended.
    pub v_cache: &'a mut [T],
    /// Keys already cached per sequence [batch].
    pub cache_seqlens: &'a [i32],
    /// Cache row of each sequence [batch] (contiguous caches); `None`: row b.
    pub cache_batch_idx: Option<&'a [i32]>,
    /// [batch, max_pages_per_seq] row-major; required iff paged.
    pub block_table: Option<&'a [i32]>,
    /// New keys [batch, seqlen_new, heads_kv, head_dim_qk]; required iff seqlen_new >= 1.
    pub k_new: Option<&'a [T]>,
    /// New values [batch, seqlen_new, heads_kv, head_dim_v]; required iff seqlen_new >= 1.
    pub v_new: Option<&'a [T]>,
    /// cos table [rotary rows, rotary dim / 2]; required iff rotary.
    pub rotary_cos: Option<&'a [T]>,
    /// sin table, like rotary_cos.
    pub rotary_sin: Option<&'a [T]>,
    /// fp32 [heads_q]; required iff the bias kind is ALiBi.
    pub alibi_slopes: Option<&'a [f32]>,
}

fn strides_ptr(s: &Option<[i64; 4]>) -> *const i64 {
    s.as_ref().map_or(ptr::null(), |a| a.as_ptr())
}

fn contiguous(extents: &[i64; 4]) -> [i64; 4] {
    [extents[1] * extents[2] * extents[3], extents[2] * extents[3], extents[3], 1]
}

fn need_span(name: &str, extents: &[i64; 4], strides: Option<[i64; 4]>) -> Result<usize> {
    let st = strides.unwrap_or_else(|| contiguous(extents));
    span(extents, &st).ok_or_else(|| {
        wrapper_error(Status::INVALID_STRIDE, format!("{name}: strides {st:?} are negative or overflow"))
    })
}

fn optional_ptr<T>(x: &Option<&[T]>) -> *const c_void {
    x.map_or(ptr::null(), |s| s.as_ptr().cast())
}

impl Plan {
    /// Put the plan in KV-cache mode with this geometry (`flashattn_plan_set_kvcache`), or
    /// leave it (`None`). Checked against the current shape now and again at every run.
    pub fn set_kvcache(&mut self, config: Option<&KvCacheConfig>) -> Result<&mut Self> {
        let st = match config {
            // SAFETY: valid plan; NULL leaves KV-cache mode.
            None => unsafe { sys::flashattn_plan_set_kvcache(self.as_raw(), ptr::null()) },
            Some(c) => {
                let (rotary, rotary_dim, rotary_rows) = match c.rotary {
                    None => (sys::FLASHATTN_ROTARY_NONE, 0, 0),
                    Some(r) => (
                        match r.form {
                            Rotary::Half => sys::FLASHATTN_ROTARY_HALF,
                            Rotary::Interleaved => sys::FLASHATTN_ROTARY_INTERLEAVED,
                        },
                        r.dim,
                        r.rows,
                    ),
                };
                let raw = sys::flashattn_kvcache_config_t {
                    page_size: c.page_size,
                    num_rows: c.num_rows,
                    max_pages_per_seq: c.max_pages_per_seq,
                    k_cache_strides: strides_ptr(&c.k_cache_strides),
                    v_cache_strides: strides_ptr(&c.v_cache_strides),
                    seqlen_new: c.seqlen_new,
                    k_new_strides: strides_ptr(&c.k_new_strides),
                    v_new_strides: strides_ptr(&c.v_new_strides),
                    rotary,
                    rotary_dim,
                    rotary_rows,
                    num_splits: c.num_splits,
                    ..Default::default()
                };
                // SAFETY: valid plan; the config and its stride arrays live across the call
                // (the library copies them).
                unsafe { sys::flashattn_plan_set_kvcache(self.as_raw(), &raw) }
            }
        };
        check(st, "flashattn_plan_set_kvcache")?;
        self.kvcache = config.copied();
        Ok(self)
    }

    /// The KV-cache configuration, if the plan is in KV-cache mode.
    pub fn kvcache(&self) -> Option<&KvCacheConfig> {
        self.kvcache.as_ref()
    }

    /// Elements each run array must hold: (name, the slice's length, the elements the plan
    /// addresses) for every array given.
    fn kvcache_lengths<T>(
        &self,
        c: &KvCacheConfig,
        run: &KvCacheRun<'_, T>,
    ) -> Result<Vec<(&'static str, usize, usize)>> {
        let s = self.shape;
        let tokens = if c.page_size > 0 { c.page_size } else { s.seqlen_k };
        let half = c.rotary.map_or(0, |r| r.dim / 2);
        let rows = c.rotary.map_or(0, |r| r.rows);
        let table = (rows.max(0) * half.max(0)) as usize;
        let mut v = vec![
            (
                "k_cache",
                run.k_cache.len(),
                need_span("k_cache", &[c.num_rows, tokens, s.heads_kv, s.head_dim_qk], c.k_cache_strides)?,
            ),
            (
                "v_cache",
                run.v_cache.len(),
                need_span("v_cache", &[c.num_rows, tokens, s.heads_kv, s.head_dim_v], c.v_cache_strides)?,
            ),
            ("cache_seqlens", run.cache_seqlens.len(), s.batch as usize),
        ];
        let new_k = [s.batch, c.seqlen_new, s.heads_kv, s.head_dim_qk];
        let new_v = [s.batch, c.seqlen_new, s.heads_kv, s.head_dim_v];
        let optional = [
            ("cache_batch_idx", run.cache_batch_idx.map(<[i32]>::len), s.batch as usize),
            ("block_table", run.block_table.map(<[i32]>::len), (s.batch * c.max_pages_per_seq).max(0) as usize),
            ("k_new", run.k_new.map(<[T]>::len), need_span("k_new", &new_k, c.k_new_strides)?),
            ("v_new", run.v_new.map(<[T]>::len), need_span("v_new", &new_v, c.v_new_strides)?),
            ("rotary_cos", run.rotary_cos.map(<[T]>::len), table),
            ("rotary_sin", run.rotary_sin.map(<[T]>::len), table),
            ("alibi_slopes", run.alibi_slopes.map(<[f32]>::len), s.heads_q as usize),
        ];
        v.extend(optional.iter().filter_map(|&(n, got, need)| got.map(|g| (n, g, need))));
        Ok(v)
    }

    /// One KV-cache run on host slices (CPU backend): append `k_new`/`v_new` (rotated) into
    /// the caches at each sequence's `cache_seqlens`, rotate q, attend to the first
    /// cache_seqlens[b] + seqlen_new keys; writes `out` and, if given, `lse`. Every slice
    /// is checked to cover what the plan addresses; the library checks the values
    /// (lengths, rows, pages) before writing anything.
    pub fn forward_kvcache<T: Element>(
        &self,
        run: KvCacheRun<'_, T>,
        out: &mut [T],
        lse: Option<&mut [f32]>,
    ) -> Result<()> {
        self.check_host::<T>()?;
        let c = self.kvcache.ok_or_else(|| {
            wrapper_error(
                Status::PLAN_INCOMPLETE,
                "the plan has no KV-cache configuration: call set_kvcache first".into(),
            )
        })?;
        self.check_len("q", run.q.len(), self.need(TensorId::Q)?)?;
        self.check_len("out", out.len(), self.need(TensorId::O)?)?;
        for (name, got, need) in self.kvcache_lengths(&c, &run)? {
            self.check_len(name, got, need)?;
        }
        let lse_ptr = match lse {
            Some(l) => {
                self.check_len("lse", l.len(), self.lse_need())?;
                l.as_mut_ptr()
            }
            None => ptr::null_mut(),
        };
        let args = sys::flashattn_kvcache_args_t {
            q: run.q.as_ptr().cast(),
            k_cache: run.k_cache.as_mut_ptr().cast(),
            v_cache: run.v_cache.as_mut_ptr().cast(),
            o: out.as_mut_ptr().cast(),
            lse: lse_ptr,
            cache_seqlens: run.cache_seqlens.as_ptr(),
            cache_batch_idx: run.cache_batch_idx.map_or(ptr::null(), <[i32]>::as_ptr),
            block_table: run.block_table.map_or(ptr::null(), <[i32]>::as_ptr),
            k_new: optional_ptr(&run.k_new),
            v_new: optional_ptr(&run.v_new),
            rotary_cos: optional_ptr(&run.rotary_cos),
            rotary_sin: optional_ptr(&run.rotary_sin),
            alibi_slopes: run.alibi_slopes.map_or(ptr::null(), <[f32]>::as_ptr),
            ..Default::default()
        };
        // SAFETY: every pointer covers what the plan addresses (checked above); host memory
        // for the CPU backend; the caches are borrowed mutably; the workspace has `bytes` bytes.
        self.with_host_workspace(Pass::ForwardKvCache, |wp, bytes| unsafe {
            self.forward_kvcache_raw(&args, wp, bytes, ptr::null_mut())
        })
    }

    /// `flashattn_fwd_kvcache` with raw pointers (device pointers for CUDA plans).
    ///
    /// # Safety
    /// As for [`Plan::forward_raw`], with the extents of the plan's KV-cache configuration
    /// for the caches, new keys/values, tables and rotary tables.
    pub unsafe fn forward_kvcache_raw(
        &self,
        args: &sys::flashattn_kvcache_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut sys::CUstream_st,
    ) -> Result<()> {
        check(
            sys::flashattn_fwd_kvcache(self.as_raw(), args, workspace, workspace_bytes, stream),
            "flashattn_fwd_kvcache",
        )
    }
}

/// Shapes of a [`combine`]: `num_splits` partial results of [batch, seqlen_q, heads,
/// head_dim] rows. Strides in elements; `None` is contiguous.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CombineShape {
    pub num_splits: i64,
    pub batch: i64,
    pub seqlen_q: i64,
    pub heads: i64,
    pub head_dim: i64,
    /// (split, batch, seq, head, dim) of the partial outputs.
    pub o_partial_strides: Option<[i64; 5]>,
    /// (split, batch, head, seq) of the partial LSE.
    pub lse_partial_strides: Option<[i64; 4]>,
    /// (batch, seq, head, dim) of the merged output.
    pub o_strides: Option<[i64; 4]>,
}

fn dense<const N: usize>(extents: [i64; N]) -> [i64; N] {
    let mut st = [1i64; N];
    for i in (0..N.saturating_sub(1)).rev() {
        st[i] = st[i + 1] * extents[i + 1];
    }
    st
}

fn span_of<const N: usize>(name: &str, got: usize, extents: [i64; N], strides: Option<[i64; N]>) -> Result<()> {
    let st = strides.unwrap_or_else(|| dense(extents));
    let need = span(&extents, &st).ok_or_else(|| {
        wrapper_error(Status::INVALID_STRIDE, format!("{name}: strides {st:?} are negative or overflow"))
    })?;
    if got < need {
        return Err(wrapper_error(
            Status::INVALID_SHAPE,
            format!("{name}: slice has {got} elements; the shape and strides address {need}"),
        ));
    }
    Ok(())
}

/// Merge partial (O, LSE) results over a split of the keys on the CPU backend
/// (`flashattn_combine`): per row, over the parts whose LSE is not -inf, lse = log sum
/// exp(lse_i) and O = sum exp(lse_i - lse) O_i; a row with no part gets O = 0 and
/// LSE = -inf. `o` is written in `T`, `lse` (fp32 [batch, heads, seqlen_q]) if given.
pub fn combine<T: Element>(
    shape: &CombineShape,
    o_partial: &[f32],
    lse_partial: &[f32],
    o: &mut [T],
    lse: Option<&mut [f32]>,
) -> Result<()> {
    let s = shape;
    span_of(
        "o_partial",
        o_partial.len(),
        [s.num_splits, s.batch, s.seqlen_q, s.heads, s.head_dim],
        s.o_partial_strides,
    )?;
    span_of("lse_partial", lse_partial.len(), [s.num_splits, s.batch, s.heads, s.seqlen_q], s.lse_partial_strides)?;
    span_of("o", o.len(), [s.batch, s.seqlen_q, s.heads, s.head_dim], s.o_strides)?;
    let lse_ptr = match lse {
        Some(l) => {
            span_of("lse", l.len(), [s.batch, s.heads, s.seqlen_q], None)?;
            l.as_mut_ptr()
        }
        None => ptr::null_mut(),
    };
    let args = sys::flashattn_combine_args_t {
        num_splits: s.num_splits,
        batch: s.batch,
        seqlen_q: s.seqlen_q,
        heads: s.heads,
        head_dim: s.head_dim,
        o_partial: o_partial.as_ptr(),
        o_partial_strides: s.o_partial_strides.as_ref().map_or(ptr::null(), |a| a.as_ptr()),
        lse_partial: lse_partial.as_ptr(),
        lse_partial_strides: s.lse_partial_strides.as_ref().map_or(ptr::null(), |a| a.as_ptr()),
        dtype: T::DTYPE.raw(),
        o: o.as_mut_ptr().cast(),
        o_strides: strides_ptr(&s.o_strides),
        lse: lse_ptr,
        ..Default::default()
    };
    // SAFETY: host slices covering what the shape and strides address (checked above).
    unsafe { combine_raw(Backend::Cpu, 0, &args, ptr::null_mut()) }
}

/// `flashattn_combine` with raw pointers (device pointers for the CUDA backend).
///
/// # Safety
/// Every pointer in `args` must address the memory its shape and strides describe, in the
/// backend's memory space (device memory of `device` for CUDA), valid until the merge
/// completes (on CUDA: until `stream` reaches it); `stream` must be a valid cudaStream_t
/// of `device` or NULL.
pub unsafe fn combine_raw(
    backend: Backend,
    device: i32,
    args: &sys::flashattn_combine_args_t,
    stream: *mut sys::CUstream_st,
) -> Result<()> {
    check(sys::flashattn_combine(backend.raw(), device, args, stream), "flashattn_combine")
}
