//! Safe Rust API of libflashattn: exact, IO-aware attention (FlashAttention) forward and
//! backward behind a stable C ABI.
//!
//! ```no_run
//! use flashattn::{Align, Backend, DType, Plan, Shape};
//! # fn main() -> Result<(), flashattn::Error> {
//! let shape = Shape::new(1, 128, 128, 8, 2, 64); // batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim
//! let mut plan = Plan::new(Backend::Cpu, 0, shape)?;
//! plan.set_dtype(DType::F32)?.set_causal(Align::TopLeft)?;
//! let q = vec![0.1f32; shape.q_len()];
//! let k = vec![0.2f32; shape.k_len()];
//! let v = vec![0.3f32; shape.v_len()];
//! let mut out = vec![0f32; shape.o_len()];
//! let mut lse = vec![0f32; shape.lse_len()];
//! plan.forward(&q, &k, &v, &mut out, Some(&mut lse), &flashattn::Inputs::default())?;
//! # Ok(()) }
//! ```
//!
//! Slices are CPU tensors (the CPU backend); their lengths are checked against the
//! memory the plan's shape and strides address before every call. Device memory (the
//! CUDA backend) goes through the `unsafe` [`Plan::forward_raw`] / [`Plan::backward_raw`].
//!
//! Inference (docs/inference.md): [`Plan::set_kvcache`] and [`Plan::forward_kvcache`] run
//! new query tokens against a contiguous or paged KV cache, appending new keys and values
//! (optionally rotated) first; [`combine`] merges partial (O, LSE) results.
use std::ffi::{c_void, CStr};
use std::fmt;
use std::ptr::{self, NonNull};

pub use flashattn_sys as sys;

mod float16;
pub use float16::{Bf16, F16};
mod kvcache;
pub use kvcache::{combine, combine_raw, CombineShape, KvCacheConfig, KvCacheRun, Rotary, RotaryConfig};

// ------------------------------------------------------------------ status and errors

/// A `flashattn_status_t` value (0 success; 1xx invalid argument; 2xx not supported; 3xx
/// resources; 4xx device; 9xx internal).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Status(pub i32);

impl Status {
    pub const SUCCESS: Status = Status(0);
    pub const INVALID_ARGUMENT: Status = Status(100);
    pub const NULL_POINTER: Status = Status(101);
    pub const INVALID_SHAPE: Status = Status(102);
    pub const INVALID_HEADS: Status = Status(103);
    pub const INVALID_STRIDE: Status = Status(104);
    pub const INVALID_ENUM: Status = Status(105);
    pub const INVALID_VALUE: Status = Status(106);
    pub const INVALID_LAYOUT: Status = Status(107);
    pub const INVALID_STRUCT_SIZE: Status = Status(108);
    pub const WORKSPACE_TOO_SMALL: Status = Status(109);
    pub const PLAN_INCOMPLETE: Status = Status(110);
    pub const INCOMPATIBLE_OPTIONS: Status = Status(111);
    pub const INVALID_SEQLENS: Status = Status(112);
    pub const MISALIGNED_POINTER: Status = Status(113);
    pub const NOT_SUPPORTED: Status = Status(200);
    pub const BACKEND_UNAVAILABLE: Status = Status(201);
    pub const HEAD_DIM_NOT_SUPPORTED: Status = Status(202);
    pub const DTYPE_NOT_SUPPORTED: Status = Status(203);
    pub const LIBRARY_UNAVAILABLE: Status = Status(204);
    pub const OUT_OF_MEMORY: Status = Status(300);
    pub const CUDA_ERROR: Status = Status(400);
    pub const NO_DEVICE: Status = Status(401);
    pub const LAUNCH_FAILED: Status = Status(402);
    pub const WRONG_MEMORY_SPACE: Status = Status(403);
    pub const INTERNAL_ERROR: Status = Status(900);

    /// The library's name for the code, e.g. "FLASHATTN_STATUS_INVALID_SHAPE".
    pub fn name(self) -> &'static str {
        // SAFETY: flashattn_status_string returns a static NUL-terminated string, never NULL.
        unsafe { CStr::from_ptr(sys::flashattn_status_string(self.0)) }.to_str().unwrap_or("FLASHATTN_STATUS_UNKNOWN")
    }

    /// True for the 1xx band (an argument is invalid).
    pub fn is_invalid_argument(self) -> bool {
        (100..200).contains(&self.0)
    }

    /// True for the 2xx band (valid but not supported here).
    pub fn is_not_supported(self) -> bool {
        (200..300).contains(&self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// A failed call: the status, the library's message (naming the argument and value), and
/// the C function that failed (or "flashattn" for checks the wrapper made itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
    pub function: &'static str,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [{}]", self.function, self.message, self.status)
    }
}

impl std::error::Error for Error {}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

fn check(status: sys::flashattn_status_t, function: &'static str) -> Result<()> {
    if status == sys::FLASHATTN_STATUS_SUCCESS {
        return Ok(());
    }
    // SAFETY: flashattn_last_error returns a thread-local NUL-terminated string, never NULL;
    // it is copied before any other library call on this thread.
    let message = unsafe { CStr::from_ptr(sys::flashattn_last_error()) }.to_string_lossy().into_owned();
    Err(Error { status: Status(status), message, function })
}

fn wrapper_error(status: Status, message: String) -> Error {
    Error { status, message, function: "flashattn" }
}

// ------------------------------------------------------------------ enums

/// Where a plan runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Backend {
    /// CUDA if a device is present and the library has CUDA, else CPU (resolved at creation).
    Auto,
    Cpu,
    Cuda,
}

impl Backend {
    fn raw(self) -> sys::flashattn_backend_t {
        match self {
            Backend::Auto => sys::FLASHATTN_BACKEND_AUTO,
            Backend::Cpu => sys::FLASHATTN_BACKEND_CPU,
            Backend::Cuda => sys::FLASHATTN_BACKEND_CUDA,
        }
    }
}

/// Element type of Q, K, V, O, dO, dQ, dK, dV and the bias.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DType {
    F16,
    Bf16,
    F32,
}

impl DType {
    fn raw(self) -> sys::flashattn_dtype_t {
        match self {
            DType::F16 => sys::FLASHATTN_DTYPE_FP16,
            DType::Bf16 => sys::FLASHATTN_DTYPE_BF16,
            DType::F32 => sys::FLASHATTN_DTYPE_FP32,
        }
    }
}

/// A tensor whose strides can be set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TensorId {
    Q,
    K,
    V,
    O,
    DO,
    DQ,
    DK,
    DV,
}

impl TensorId {
    const ALL: [TensorId; 8] =
        [TensorId::Q, TensorId::K, TensorId::V, TensorId::O, TensorId::DO, TensorId::DQ, TensorId::DK, TensorId::DV];

    fn raw(self) -> sys::flashattn_tensor_t {
        self as sys::flashattn_tensor_t
    }
}

/// Algorithm of a plan.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Algorithm {
    /// Tiled FlashAttention (default).
    Flash,
    /// Standard attention materializing S and P (baseline).
    Standard,
}

/// How row i lines up with column j in masks and ALiBi.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Align {
    /// i' = i.
    TopLeft,
    /// i' = i + seqlen_k - seqlen_q (per sequence in varlen mode).
    BottomRight,
}

impl Align {
    fn raw(self) -> sys::flashattn_mask_align_t {
        match self {
            Align::TopLeft => sys::FLASHATTN_ALIGN_TOP_LEFT,
            Align::BottomRight => sys::FLASHATTN_ALIGN_BOTTOM_RIGHT,
        }
    }
}

/// Additive score bias.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BiasKind {
    None,
    /// bias[b, h, i, j] with element strides (batch, head, q, k); 0 broadcasts a dimension.
    Tensor([i64; 4]),
    /// slope[h] * (j - i').
    Alibi,
    /// -slope[h] * |i' - j|.
    AlibiSymmetric,
}

/// A pass, for workspace queries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pass {
    Forward,
    Backward,
    /// [`Plan::forward_kvcache`] (needs [`Plan::set_kvcache`]).
    ForwardKvCache,
}

/// Element types a plan can run on slices of: `f32`, [`F16`], [`Bf16`], and with the cargo
/// feature `half` the `half` crate's `f16` and `bf16`.
///
/// # Safety
/// Implementors must have exactly the size and bit layout of `DTYPE`'s C element type.
pub unsafe trait Element: Copy + 'static {
    const DTYPE: DType;
}
unsafe impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
unsafe impl Element for F16 {
    const DTYPE: DType = DType::F16;
}
unsafe impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
}
// SAFETY: `half::f16` and `half::bf16` are `#[repr(transparent)]` wrappers of their u16 bits
// (binary16 and bfloat16, as F16 and Bf16); the size is also checked at compile time.
#[cfg(feature = "half")]
const _: () = assert!(std::mem::size_of::<::half::f16>() == 2 && std::mem::size_of::<::half::bf16>() == 2);
#[cfg(feature = "half")]
unsafe impl Element for ::half::f16 {
    const DTYPE: DType = DType::F16;
}
#[cfg(feature = "half")]
unsafe impl Element for ::half::bf16 {
    const DTYPE: DType = DType::Bf16;
}

// ------------------------------------------------------------------ library info

/// (major, minor, patch) of the linked library.
pub fn version() -> (i32, i32, i32) {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: three valid out-pointers.
    unsafe { sys::flashattn_get_version(&mut a, &mut b, &mut c) };
    (a, b, c)
}

/// CUDA devices usable by the library (0 without CUDA).
pub fn cuda_device_count() -> i32 {
    // SAFETY: no arguments; never fails.
    unsafe { sys::flashattn_cuda_device_count() }
}

/// Whether the library was built with the CUDA backend.
pub fn has_cuda_backend() -> bool {
    // SAFETY: no arguments; never fails.
    unsafe { sys::flashattn_has_cuda_backend() != 0 }
}

// ------------------------------------------------------------------ shapes

/// Problem shape. In variable-length mode seqlen_q/k are the maximum lengths.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Shape {
    pub batch: i64,
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    pub heads_q: i64,
    pub heads_kv: i64,
    pub head_dim_qk: i64,
    pub head_dim_v: i64,
}

impl Shape {
    /// A shape with head_dim_v = head_dim_qk.
    pub fn new(batch: i64, seqlen_q: i64, seqlen_k: i64, heads_q: i64, heads_kv: i64, head_dim: i64) -> Self {
        Shape { batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk: head_dim, head_dim_v: head_dim }
    }

    /// The same shape with another head_dim_v.
    pub fn with_head_dim_v(mut self, head_dim_v: i64) -> Self {
        self.head_dim_v = head_dim_v;
        self
    }

    /// Elements of a contiguous Q (= dQ).
    pub fn q_len(&self) -> usize {
        (self.batch * self.seqlen_q * self.heads_q * self.head_dim_qk) as usize
    }
    /// Elements of a contiguous K (= dK).
    pub fn k_len(&self) -> usize {
        (self.batch * self.seqlen_k * self.heads_kv * self.head_dim_qk) as usize
    }
    /// Elements of a contiguous V (= dV).
    pub fn v_len(&self) -> usize {
        (self.batch * self.seqlen_k * self.heads_kv * self.head_dim_v) as usize
    }
    /// Elements of a contiguous O (= dO).
    pub fn o_len(&self) -> usize {
        (self.batch * self.seqlen_q * self.heads_q * self.head_dim_v) as usize
    }
    /// Elements of the LSE, [batch, heads_q, seqlen_q].
    pub fn lse_len(&self) -> usize {
        (self.batch * self.heads_q * self.seqlen_q) as usize
    }

    fn dims(&self, t: TensorId) -> (i64, i64, i64, i64) {
        match t {
            TensorId::Q | TensorId::DQ => (self.batch, self.seqlen_q, self.heads_q, self.head_dim_qk),
            TensorId::K | TensorId::DK => (self.batch, self.seqlen_k, self.heads_kv, self.head_dim_qk),
            TensorId::V | TensorId::DV => (self.batch, self.seqlen_k, self.heads_kv, self.head_dim_v),
            TensorId::O | TensorId::DO => (self.batch, self.seqlen_q, self.heads_q, self.head_dim_v),
        }
    }

    fn contiguous(&self, t: TensorId) -> [i64; 4] {
        let (_, s, h, d) = self.dims(t);
        [s * h * d, h * d, d, 1]
    }
}

/// Elements from the first addressed element to one past the last (0 if any extent is 0).
fn span(extents: &[i64], strides: &[i64]) -> Option<usize> {
    let mut last: i128 = 0;
    for (&n, &s) in extents.iter().zip(strides) {
        if n <= 0 {
            return Some(0);
        }
        if s < 0 {
            return None;
        }
        last += (n as i128 - 1) * s as i128;
    }
    usize::try_from(last + 1).ok()
}

// ------------------------------------------------------------------ run inputs

/// Optional per-run inputs (bias tensor, ALiBi slopes, varlen offsets).
pub struct Inputs<'a, T> {
    /// Bias tensor (plan dtype, plan bias strides); required iff the bias kind is Tensor.
    pub bias: Option<&'a [T]>,
    /// fp32 [heads_q]; required iff the bias kind is ALiBi.
    pub alibi_slopes: Option<&'a [f32]>,
    /// int32 [batch + 1] token offsets; required iff varlen.
    pub cu_seqlens_q: Option<&'a [i32]>,
    /// int32 [batch + 1] token offsets; required iff varlen.
    pub cu_seqlens_k: Option<&'a [i32]>,
}

impl<T> Default for Inputs<'_, T> {
    fn default() -> Self {
        Inputs { bias: None, alibi_slopes: None, cu_seqlens_q: None, cu_seqlens_k: None }
    }
}

/// Gradient outputs of [`Plan::backward`].
pub struct Grads<'a, T> {
    pub dq: &'a mut [T],
    pub dk: &'a mut [T],
    pub dv: &'a mut [T],
    /// Receives dBias (bias strides; summed over broadcast dims). Only with a bias tensor.
    pub dbias: Option<&'a mut [T]>,
}

/// A block-sparse layout: `layout` is [layout_heads, num_row_blocks, num_col_blocks] row-major.
#[derive(Clone, Copy, Debug)]
pub struct BlockSparse<'a> {
    pub layout: &'a [u8],
    pub layout_heads: i64,
    pub num_row_blocks: i64,
    pub num_col_blocks: i64,
    pub block_q: i64,
    pub block_k: i64,
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Chunk([u8; 64]);

/// Host scratch, 64-byte aligned.
fn host_workspace(bytes: usize) -> Vec<Chunk> {
    vec![Chunk([0; 64]); (bytes + 63) / 64]
}

// ------------------------------------------------------------------ plan

/// An attention problem bound to a backend (RAII: destroyed on drop).
///
/// Setters take `&mut self` and return `Result<&mut Self>` so they chain with `?`; a
/// rejected value leaves the plan unchanged. Runs take `&self`: a configured plan can be
/// shared between threads (`Sync`) and run concurrently, and the borrow checker keeps
/// setters from racing with runs.
pub struct Plan {
    raw: NonNull<sys::flashattn_plan_s>,
    backend: Backend,
    shape: Shape,
    dtype: DType,
    strides: [[i64; 4]; 8],
    varlen: Option<(i64, i64)>,
    bias: BiasKind,
    kvcache: Option<KvCacheConfig>,
    alibi_batch_stride: i64,
}

// SAFETY: the C API allows using a plan from any thread; concurrent runs (&self) are allowed
// by its threading contract and setters need &mut self.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: raw came from flashattn_plan_create and is destroyed exactly once.
        unsafe { sys::flashattn_plan_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("backend", &self.backend)
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field("varlen", &self.varlen)
            .field("bias", &self.bias)
            .finish()
    }
}

impl Plan {
    /// Create a plan on `backend` (device ordinal for CUDA) and set its shape. Defaults:
    /// FP16, contiguous BSHD strides, no mask/bias/dropout, scale 1/sqrt(head_dim_qk).
    pub fn new(backend: Backend, device: i32, shape: Shape) -> Result<Plan> {
        let mut raw: sys::flashattn_plan_t = ptr::null_mut();
        // SAFETY: valid out-pointer.
        check(unsafe { sys::flashattn_plan_create(&mut raw, backend.raw(), device) }, "flashattn_plan_create")?;
        let raw =
            NonNull::new(raw).ok_or_else(|| wrapper_error(Status::INTERNAL_ERROR, "plan_create gave NULL".into()))?;
        let mut resolved: sys::flashattn_backend_t = 0;
        // SAFETY: valid plan and out-pointer.
        let st = unsafe { sys::flashattn_plan_get_backend(raw.as_ptr(), &mut resolved) };
        let mut plan = Plan {
            raw,
            backend: if resolved == sys::FLASHATTN_BACKEND_CUDA { Backend::Cuda } else { Backend::Cpu },
            shape,
            dtype: DType::F16,
            strides: [[0; 4]; 8],
            varlen: None,
            bias: BiasKind::None,
            kvcache: None,
            alibi_batch_stride: 0,
        };
        check(st, "flashattn_plan_get_backend")?;
        plan.set_shape(shape)?;
        Ok(plan)
    }

    /// A CPU plan of `shape` with element type `dtype`.
    pub fn cpu(shape: Shape, dtype: DType) -> Result<Plan> {
        let mut p = Plan::new(Backend::Cpu, 0, shape)?;
        p.set_dtype(dtype)?;
        Ok(p)
    }

    /// The raw handle, for calling `flashattn-sys` functions directly.
    pub fn as_raw(&self) -> sys::flashattn_plan_t {
        self.raw.as_ptr()
    }

    /// The resolved backend (never Auto).
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// (total_q, total_k) in variable-length mode.
    pub fn varlen(&self) -> Option<(i64, i64)> {
        self.varlen
    }

    /// The strides set for a tensor.
    pub fn strides(&self, t: TensorId) -> [i64; 4] {
        self.strides[t as usize]
    }

    /// Workspace bytes a pass needs.
    pub fn workspace_size(&self, pass: Pass) -> Result<usize> {
        let mut n = 0usize;
        let p = match pass {
            Pass::Forward => sys::FLASHATTN_PASS_FORWARD,
            Pass::Backward => sys::FLASHATTN_PASS_BACKWARD,
            Pass::ForwardKvCache => sys::FLASHATTN_PASS_FORWARD_KVCACHE,
        };
        // SAFETY: valid plan and out-pointer.
        check(
            unsafe { sys::flashattn_plan_get_workspace_size(self.as_raw(), p, &mut n) },
            "flashattn_plan_get_workspace_size",
        )?;
        Ok(n)
    }

    /// Set the shape; resets every tensor's strides to contiguous BSHD.
    pub fn set_shape(&mut self, s: Shape) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe {
                sys::flashattn_plan_set_shape(
                    self.as_raw(),
                    s.batch,
                    s.seqlen_q,
                    s.seqlen_k,
                    s.heads_q,
                    s.heads_kv,
                    s.head_dim_qk,
                    s.head_dim_v,
                )
            },
            "flashattn_plan_set_shape",
        )?;
        self.shape = s;
        for t in TensorId::ALL {
            self.strides[t as usize] = s.contiguous(t);
        }
        Ok(self)
    }

    /// Set the element type.
    pub fn set_dtype(&mut self, dtype: DType) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(unsafe { sys::flashattn_plan_set_dtype(self.as_raw(), dtype.raw()) }, "flashattn_plan_set_dtype")?;
        self.dtype = dtype;
        Ok(self)
    }

    /// Set one tensor's element strides (batch, seq, head, dim); dim must be 1.
    pub fn set_strides(&mut self, t: TensorId, strides: [i64; 4]) -> Result<&mut Self> {
        // SAFETY: valid plan; strides points to 4 i64.
        check(
            unsafe { sys::flashattn_plan_set_strides(self.as_raw(), t.raw(), strides.as_ptr()) },
            "flashattn_plan_set_strides",
        )?;
        self.strides[t as usize] = strides;
        Ok(self)
    }

    /// Softmax scale (0 restores 1/sqrt(head_dim_qk)).
    pub fn set_scale(&mut self, scale: f32) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe { sys::flashattn_plan_set_softmax_scale(self.as_raw(), scale) },
            "flashattn_plan_set_softmax_scale",
        )?;
        Ok(self)
    }

    /// Algorithm.
    pub fn set_algorithm(&mut self, a: Algorithm) -> Result<&mut Self> {
        let raw = match a {
            Algorithm::Flash => sys::FLASHATTN_ALGORITHM_FLASH,
            Algorithm::Standard => sys::FLASHATTN_ALGORITHM_STANDARD,
        };
        // SAFETY: valid plan.
        check(unsafe { sys::flashattn_plan_set_algorithm(self.as_raw(), raw) }, "flashattn_plan_set_algorithm")?;
        Ok(self)
    }

    /// Packed variable-length sequences with these token totals (`None` disables).
    pub fn set_varlen(&mut self, totals: Option<(i64, i64)>) -> Result<&mut Self> {
        let (en, tq, tk) = match totals {
            Some((q, k)) => (1, q, k),
            None => (0, 0, 0),
        };
        // SAFETY: valid plan.
        check(unsafe { sys::flashattn_plan_set_varlen(self.as_raw(), en, tq, tk) }, "flashattn_plan_set_varlen")?;
        self.varlen = totals;
        Ok(self)
    }

    /// Bitwise reproducible gradients.
    pub fn set_deterministic(&mut self, enabled: bool) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe { sys::flashattn_plan_set_deterministic(self.as_raw(), enabled as i32) },
            "flashattn_plan_set_deterministic",
        )?;
        Ok(self)
    }

    /// The backward adds its gradients to `dq`, `dk`, `dv` (the fp32 sum of each old value
    /// and the gradient, rounded once) instead of overwriting them; `dbias` cannot be accumulated.
    pub fn set_grad_accumulate(&mut self, enabled: bool) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe { sys::flashattn_plan_set_grad_accumulate(self.as_raw(), enabled as i32) },
            "flashattn_plan_set_grad_accumulate",
        )?;
        Ok(self)
    }

    /// Band mask: keep (i, j) iff i' - left <= j <= i' + right (negative = unbounded).
    pub fn set_band_mask(&mut self, align: Align, window_left: i64, window_right: i64) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe { sys::flashattn_plan_set_band_mask(self.as_raw(), align.raw(), window_left, window_right) },
            "flashattn_plan_set_band_mask",
        )?;
        Ok(self)
    }

    /// Causal mask (window_left unbounded, window_right 0).
    pub fn set_causal(&mut self, align: Align) -> Result<&mut Self> {
        self.set_band_mask(align, sys::FLASHATTN_WINDOW_UNBOUNDED, 0)
    }

    /// Sliding window; `None` is unbounded on that side.
    pub fn set_window(&mut self, align: Align, left: Option<i64>, right: Option<i64>) -> Result<&mut Self> {
        self.set_band_mask(align, left.unwrap_or(-1), right.unwrap_or(-1))
    }

    /// Softcap (0 disables).
    pub fn set_softcap(&mut self, softcap: f32) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(unsafe { sys::flashattn_plan_set_softcap(self.as_raw(), softcap) }, "flashattn_plan_set_softcap")?;
        Ok(self)
    }

    /// Bias kind (and strides for a tensor).
    pub fn set_bias(&mut self, kind: BiasKind) -> Result<&mut Self> {
        let (raw, st): (sys::flashattn_bias_t, Option<[i64; 4]>) = match kind {
            BiasKind::None => (sys::FLASHATTN_BIAS_NONE, None),
            BiasKind::Tensor(s) => (sys::FLASHATTN_BIAS_TENSOR, Some(s)),
            BiasKind::Alibi => (sys::FLASHATTN_BIAS_ALIBI, None),
            BiasKind::AlibiSymmetric => (sys::FLASHATTN_BIAS_ALIBI_SYMMETRIC, None),
        };
        let p = st.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        // SAFETY: valid plan; p is NULL or 4 i64.
        check(unsafe { sys::flashattn_plan_set_bias(self.as_raw(), raw, p) }, "flashattn_plan_set_bias")?;
        self.bias = kind;
        self.alibi_batch_stride = 0;
        Ok(self)
    }

    /// ALiBi slopes per (sequence, head): `alibi_slopes[b * batch_stride + h]`; 0 (the
    /// default) is one slope per head. Call after `set_bias` with an ALiBi kind (which resets it).
    pub fn set_alibi_batch_stride(&mut self, batch_stride: i64) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe { sys::flashattn_plan_set_alibi_batch_stride(self.as_raw(), batch_stride) },
            "flashattn_plan_set_alibi_batch_stride",
        )?;
        self.alibi_batch_stride = batch_stride;
        Ok(self)
    }

    /// Dropout probability p in [0, 1) (0 disables) with the Philox seed and offset. An
    /// element is kept iff its 16-bit Philox value r >= t = min(round(p * 65536), 65535), and
    /// kept values are scaled by 65536 / (65536 - t) (`flashattn_plan_set_dropout`).
    pub fn set_dropout(&mut self, p: f32, seed: u64, offset: u64) -> Result<&mut Self> {
        // SAFETY: valid plan.
        check(
            unsafe { sys::flashattn_plan_set_dropout(self.as_raw(), p, seed, offset) },
            "flashattn_plan_set_dropout",
        )?;
        Ok(self)
    }

    /// Block-sparse layout (`None` clears). The plan copies it.
    pub fn set_block_sparse(&mut self, layout: Option<BlockSparse<'_>>) -> Result<&mut Self> {
        let st = match layout {
            None => {
                // SAFETY: valid plan; NULL clears.
                unsafe { sys::flashattn_plan_set_block_sparse(self.as_raw(), ptr::null(), 0, 0, 0, 0, 0) }
            }
            Some(l) => {
                // Negative counts are left for the library to reject with its own message.
                let need = [l.layout_heads, l.num_row_blocks, l.num_col_blocks]
                    .iter()
                    .try_fold(1usize, |acc, &n| acc.checked_mul(n.max(0) as usize))
                    .unwrap_or(usize::MAX);
                if l.layout.len() < need {
                    return Err(wrapper_error(
                        Status::INVALID_LAYOUT,
                        format!(
                            "layout has {} entries; layout_heads*num_row_blocks*num_col_blocks = {}",
                            l.layout.len(),
                            need
                        ),
                    ));
                }
                // SAFETY: valid plan; layout holds at least the entries the library reads.
                unsafe {
                    sys::flashattn_plan_set_block_sparse(
                        self.as_raw(),
                        l.layout.as_ptr(),
                        l.layout_heads,
                        l.num_row_blocks,
                        l.num_col_blocks,
                        l.block_q,
                        l.block_k,
                    )
                }
            }
        };
        check(st, "flashattn_plan_set_block_sparse")?;
        Ok(self)
    }

    // ---- slice checks ----

    fn need(&self, t: TensorId) -> Result<usize> {
        let st = self.strides[t as usize];
        let (b, s, h, d) = self.shape.dims(t);
        let r = match self.varlen {
            Some((tq, tk)) => {
                let tokens = match t {
                    TensorId::K | TensorId::V | TensorId::DK | TensorId::DV => tk,
                    _ => tq,
                };
                span(&[tokens, h, d], &st[1..])
            }
            None => span(&[b, s, h, d], &st),
        };
        r.ok_or_else(|| {
            wrapper_error(Status::INVALID_STRIDE, format!("{t:?}: strides {st:?} are negative or overflow"))
        })
    }

    fn check_len(&self, name: &str, got: usize, need: usize) -> Result<()> {
        if got < need {
            return Err(wrapper_error(
                Status::INVALID_SHAPE,
                format!("{name}: slice has {got} elements; the plan's shape and strides address {need}"),
            ));
        }
        Ok(())
    }

    fn lse_need(&self) -> usize {
        match self.varlen {
            Some((tq, _)) => (self.shape.heads_q * tq) as usize,
            None => self.shape.lse_len(),
        }
    }

    fn bias_need(&self) -> Result<usize> {
        let s = self.shape;
        match self.bias {
            BiasKind::Tensor(st) => span(&[s.batch, s.heads_q, s.seqlen_q, s.seqlen_k], &st)
                .ok_or_else(|| wrapper_error(Status::INVALID_STRIDE, format!("bias strides {st:?} overflow"))),
            _ => Ok(0),
        }
    }

    fn check_host<T: Element>(&self) -> Result<()> {
        if self.backend != Backend::Cpu {
            return Err(wrapper_error(
                Status::WRONG_MEMORY_SPACE,
                "slices are host memory but the plan runs on CUDA; use forward_raw/backward_raw with device pointers"
                    .into(),
            ));
        }
        if T::DTYPE != self.dtype {
            return Err(wrapper_error(
                Status::INVALID_ARGUMENT,
                format!("element type {:?} differs from the plan's dtype {:?}", T::DTYPE, self.dtype),
            ));
        }
        Ok(())
    }

    fn check_inputs<T>(&self, x: &Inputs<'_, T>) -> Result<()> {
        if let Some(b) = x.bias {
            self.check_len("bias", b.len(), self.bias_need()?)?;
        } else if matches!(self.bias, BiasKind::Tensor(_)) {
            return Err(wrapper_error(
                Status::NULL_POINTER,
                "bias: the plan's bias kind is Tensor but none given".into(),
            ));
        }
        if let Some(a) = x.alibi_slopes {
            let rows = if self.alibi_batch_stride == 0 { 1 } else { self.shape.batch };
            let need = (rows - 1) * self.alibi_batch_stride + self.shape.heads_q;
            self.check_len("alibi_slopes", a.len(), need as usize)?;
        }
        for (name, cu) in [("cu_seqlens_q", x.cu_seqlens_q), ("cu_seqlens_k", x.cu_seqlens_k)] {
            if let Some(c) = cu {
                if c.len() != self.shape.batch as usize + 1 {
                    return Err(wrapper_error(
                        Status::INVALID_SHAPE,
                        format!("{name} has {} entries; batch + 1 = {}", c.len(), self.shape.batch + 1),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Forward pass on host slices (CPU backend): writes `out` and, if given, `lse`.
    pub fn forward<T: Element>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &mut [T],
        lse: Option<&mut [f32]>,
        inputs: &Inputs<'_, T>,
    ) -> Result<()> {
        self.check_host::<T>()?;
        self.check_len("q", q.len(), self.need(TensorId::Q)?)?;
        self.check_len("k", k.len(), self.need(TensorId::K)?)?;
        self.check_len("v", v.len(), self.need(TensorId::V)?)?;
        self.check_len("out", out.len(), self.need(TensorId::O)?)?;
        let lse_ptr = match lse {
            Some(l) => {
                self.check_len("lse", l.len(), self.lse_need())?;
                l.as_mut_ptr()
            }
            None => ptr::null_mut(),
        };
        self.check_inputs(inputs)?;
        let args = sys::flashattn_fwd_args_t {
            q: q.as_ptr().cast(),
            k: k.as_ptr().cast(),
            v: v.as_ptr().cast(),
            o: out.as_mut_ptr().cast(),
            lse: lse_ptr,
            bias: inputs.bias.map_or(ptr::null(), |b| b.as_ptr().cast()),
            alibi_slopes: inputs.alibi_slopes.map_or(ptr::null(), |a| a.as_ptr()),
            cu_seqlens_q: inputs.cu_seqlens_q.map_or(ptr::null(), |c| c.as_ptr()),
            cu_seqlens_k: inputs.cu_seqlens_k.map_or(ptr::null(), |c| c.as_ptr()),
            ..Default::default()
        };
        // SAFETY: every pointer covers what the plan addresses (checked above); host memory
        // for the CPU backend; the workspace has `bytes` bytes.
        self.with_host_workspace(Pass::Forward, |wp, bytes| unsafe {
            self.forward_raw(&args, wp, bytes, ptr::null_mut())
        })
    }

    /// Backward pass on host slices (CPU backend): writes dq, dk, dv (and dbias).
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Element>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
        lse: &[f32],
        dout: &[T],
        grads: Grads<'_, T>,
        inputs: &Inputs<'_, T>,
    ) -> Result<()> {
        self.check_host::<T>()?;
        self.check_len("q", q.len(), self.need(TensorId::Q)?)?;
        self.check_len("k", k.len(), self.need(TensorId::K)?)?;
        self.check_len("v", v.len(), self.need(TensorId::V)?)?;
        self.check_len("out", out.len(), self.need(TensorId::O)?)?;
        self.check_len("lse", lse.len(), self.lse_need())?;
        self.check_len("dout", dout.len(), self.need(TensorId::DO)?)?;
        self.check_len("dq", grads.dq.len(), self.need(TensorId::DQ)?)?;
        self.check_len("dk", grads.dk.len(), self.need(TensorId::DK)?)?;
        self.check_len("dv", grads.dv.len(), self.need(TensorId::DV)?)?;
        self.check_inputs(inputs)?;
        let dbias = match grads.dbias {
            Some(d) => {
                self.check_len("dbias", d.len(), self.bias_need()?)?;
                d.as_mut_ptr().cast()
            }
            None => ptr::null_mut(),
        };
        let args = sys::flashattn_bwd_args_t {
            q: q.as_ptr().cast(),
            k: k.as_ptr().cast(),
            v: v.as_ptr().cast(),
            o: out.as_ptr().cast(),
            lse: lse.as_ptr(),
            dout: dout.as_ptr().cast(),
            dq: grads.dq.as_mut_ptr().cast(),
            dk: grads.dk.as_mut_ptr().cast(),
            dv: grads.dv.as_mut_ptr().cast(),
            bias: inputs.bias.map_or(ptr::null(), |b| b.as_ptr().cast()),
            dbias,
            alibi_slopes: inputs.alibi_slopes.map_or(ptr::null(), |a| a.as_ptr()),
            cu_seqlens_q: inputs.cu_seqlens_q.map_or(ptr::null(), |c| c.as_ptr()),
            cu_seqlens_k: inputs.cu_seqlens_k.map_or(ptr::null(), |c| c.as_ptr()),
            ..Default::default()
        };
        // SAFETY: as in forward.
        self.with_host_workspace(Pass::Backward, |wp, bytes| unsafe {
            self.backward_raw(&args, wp, bytes, ptr::null_mut())
        })
    }

    /// `run(workspace, bytes)` with a host workspace of the size `pass` needs (NULL if 0 bytes).
    fn with_host_workspace(&self, pass: Pass, run: impl FnOnce(*mut c_void, usize) -> Result<()>) -> Result<()> {
        let bytes = self.workspace_size(pass)?;
        let mut ws = host_workspace(bytes);
        let wp = if bytes == 0 { ptr::null_mut() } else { ws.as_mut_ptr().cast::<c_void>() };
        run(wp, bytes)
    }

    /// `flashattn_fwd` with raw pointers (device pointers for CUDA plans).
    ///
    /// # Safety
    /// Every non-NULL pointer in `args` must address the memory the plan's shape, strides
    /// and dtype describe, in the plan's memory space (device memory of the plan's device
    /// for CUDA, host for CPU), valid until the pass completes (on CUDA: until `stream`
    /// reaches it); outputs must not be accessed concurrently; `workspace` must hold
    /// `workspace_bytes` bytes in the same memory space; `stream` must be a valid
    /// cudaStream_t of the plan's device or NULL.
    pub unsafe fn forward_raw(
        &self,
        args: &sys::flashattn_fwd_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut sys::CUstream_st,
    ) -> Result<()> {
        check(sys::flashattn_fwd(self.as_raw(), args, workspace, workspace_bytes, stream), "flashattn_fwd")
    }

    /// `flashattn_bwd` with raw pointers (device pointers for CUDA plans).
    ///
    /// # Safety
    /// As for [`Plan::forward_raw`].
    pub unsafe fn backward_raw(
        &self,
        args: &sys::flashattn_bwd_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut sys::CUstream_st,
    ) -> Result<()> {
        check(sys::flashattn_bwd(self.as_raw(), args, workspace, workspace_bytes, stream), "flashattn_bwd")
    }
}
