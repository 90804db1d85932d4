//! Raw FFI declarations of libflashattn, written by hand to match `include/flashattn.h`
//! exactly (ABI major version 0). See the header for the meaning of every function,
//! argument and field; the safe wrapper is the `flashattn` crate.
//!
//! C enums are passed as `c_int` (their size and ABI on every supported platform); the
//! enum values are the `FLASHATTN_*` constants below.
#![allow(non_camel_case_types)]

// std::os::raw rather than core::ffi (no_std), whose C types need Rust 1.64: Debian 12 has 1.63.
use std::os::raw::{c_char, c_float, c_int, c_void};

/// Major version; the SONAME is libflashattn.so.MAJOR.
pub const FLASHATTN_VERSION_MAJOR: c_int = 0;
/// Minor version of the header these declarations were written from.
pub const FLASHATTN_VERSION_MINOR: c_int = 1;
/// Patch version of the header these declarations were written from.
pub const FLASHATTN_VERSION_PATCH: c_int = 0;
/// MAJOR*10000 + MINOR*100 + PATCH.
pub const FLASHATTN_VERSION_NUMBER: c_int =
    FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH;
/// Largest supported head_dim_qk and head_dim_v.
pub const FLASHATTN_MAX_HEAD_DIM: i64 = 256;
/// A window value meaning "no bound on this side".
pub const FLASHATTN_WINDOW_UNBOUNDED: i64 = -1;

/// `flashattn_status_t`.
pub type flashattn_status_t = c_int;
pub const FLASHATTN_STATUS_SUCCESS: flashattn_status_t = 0;
pub const FLASHATTN_STATUS_INVALID_ARGUMENT: flashattn_status_t = 100;
pub const FLASHATTN_STATUS_NULL_POINTER: flashattn_status_t = 101;
pub const FLASHATTN_STATUS_INVALID_SHAPE: flashattn_status_t = 102;
pub const FLASHATTN_STATUS_INVALID_HEADS: flashattn_status_t = 103;
pub const FLASHATTN_STATUS_INVALID_STRIDE: flashattn_status_t = 104;
pub const FLASHATTN_STATUS_INVALID_ENUM: flashattn_status_t = 105;
pub const FLASHATTN_STATUS_INVALID_VALUE: flashattn_status_t = 106;
pub const FLASHATTN_STATUS_INVALID_LAYOUT: flashattn_status_t = 107;
pub const FLASHATTN_STATUS_INVALID_STRUCT_SIZE: flashattn_status_t = 108;
pub const FLASHATTN_STATUS_WORKSPACE_TOO_SMALL: flashattn_status_t = 109;
pub const FLASHATTN_STATUS_PLAN_INCOMPLETE: flashattn_status_t = 110;
pub const FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS: flashattn_status_t = 111;
pub const FLASHATTN_STATUS_INVALID_SEQLENS: flashattn_status_t = 112;
pub const FLASHATTN_STATUS_MISALIGNED_POINTER: flashattn_status_t = 113;
pub const FLASHATTN_STATUS_NOT_SUPPORTED: flashattn_status_t = 200;
pub const FLASHATTN_STATUS_BACKEND_UNAVAILABLE: flashattn_status_t = 201;
pub const FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED: flashattn_status_t = 202;
pub const FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED: flashattn_status_t = 203;
pub const FLASHATTN_STATUS_LIBRARY_UNAVAILABLE: flashattn_status_t = 204;
pub const FLASHATTN_STATUS_OUT_OF_MEMORY: flashattn_status_t = 300;
pub const FLASHATTN_STATUS_CUDA_ERROR: flashattn_status_t = 400;
pub const FLASHATTN_STATUS_NO_DEVICE: flashattn_status_t = 401;
pub const FLASHATTN_STATUS_LAUNCH_FAILED: flashattn_status_t = 402;
pub const FLASHATTN_STATUS_WRONG_MEMORY_SPACE: flashattn_status_t = 403;
pub const FLASHATTN_STATUS_INTERNAL_ERROR: flashattn_status_t = 900;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_STATUS_MAX_ENUM: flashattn_status_t = 0x7FFF_FFFF;

/// `flashattn_backend_t`.
pub type flashattn_backend_t = c_int;
pub const FLASHATTN_BACKEND_AUTO: flashattn_backend_t = 0;
pub const FLASHATTN_BACKEND_CPU: flashattn_backend_t = 1;
pub const FLASHATTN_BACKEND_CUDA: flashattn_backend_t = 2;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_BACKEND_MAX_ENUM: flashattn_backend_t = 0x7FFF_FFFF;

/// `flashattn_dtype_t`.
pub type flashattn_dtype_t = c_int;
pub const FLASHATTN_DTYPE_FP16: flashattn_dtype_t = 0;
pub const FLASHATTN_DTYPE_BF16: flashattn_dtype_t = 1;
pub const FLASHATTN_DTYPE_FP32: flashattn_dtype_t = 2;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_DTYPE_MAX_ENUM: flashattn_dtype_t = 0x7FFF_FFFF;

/// `flashattn_tensor_t`.
pub type flashattn_tensor_t = c_int;
pub const FLASHATTN_TENSOR_Q: flashattn_tensor_t = 0;
pub const FLASHATTN_TENSOR_K: flashattn_tensor_t = 1;
pub const FLASHATTN_TENSOR_V: flashattn_tensor_t = 2;
pub const FLASHATTN_TENSOR_O: flashattn_tensor_t = 3;
pub const FLASHATTN_TENSOR_DO: flashattn_tensor_t = 4;
pub const FLASHATTN_TENSOR_DQ: flashattn_tensor_t = 5;
pub const FLASHATTN_TENSOR_DK: flashattn_tensor_t = 6;
pub const FLASHATTN_TENSOR_DV: flashattn_tensor_t = 7;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_TENSOR_MAX_ENUM: flashattn_tensor_t = 0x7FFF_FFFF;

/// `flashattn_algorithm_t`.
pub type flashattn_algorithm_t = c_int;
pub const FLASHATTN_ALGORITHM_FLASH: flashattn_algorithm_t = 0;
pub const FLASHATTN_ALGORITHM_STANDARD: flashattn_algorithm_t = 1;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_ALGORITHM_MAX_ENUM: flashattn_algorithm_t = 0x7FFF_FFFF;

/// `flashattn_mask_align_t`.
pub type flashattn_mask_align_t = c_int;
pub const FLASHATTN_ALIGN_TOP_LEFT: flashattn_mask_align_t = 0;
pub const FLASHATTN_ALIGN_BOTTOM_RIGHT: flashattn_mask_align_t = 1;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_ALIGN_MAX_ENUM: flashattn_mask_align_t = 0x7FFF_FFFF;

/// `flashattn_bias_t`.
pub type flashattn_bias_t = c_int;
pub const FLASHATTN_BIAS_NONE: flashattn_bias_t = 0;
pub const FLASHATTN_BIAS_TENSOR: flashattn_bias_t = 1;
pub const FLASHATTN_BIAS_ALIBI: flashattn_bias_t = 2;
pub const FLASHATTN_BIAS_ALIBI_SYMMETRIC: flashattn_bias_t = 3;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_BIAS_MAX_ENUM: flashattn_bias_t = 0x7FFF_FFFF;

/// `flashattn_pass_t`.
pub type flashattn_pass_t = c_int;
pub const FLASHATTN_PASS_FORWARD: flashattn_pass_t = 0;
pub const FLASHATTN_PASS_BACKWARD: flashattn_pass_t = 1;
pub const FLASHATTN_PASS_FORWARD_KVCACHE: flashattn_pass_t = 2;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_PASS_MAX_ENUM: flashattn_pass_t = 0x7FFF_FFFF;

/// `struct CUstream_st` (the type behind cudaStream_t); only ever used by pointer.
#[repr(C)]
pub struct CUstream_st {
    _private: [u8; 0],
}

/// `struct flashattn_plan_s`, opaque.
#[repr(C)]
pub struct flashattn_plan_s {
    _private: [u8; 0],
}

/// `flashattn_plan_t`.
pub type flashattn_plan_t = *mut flashattn_plan_s;

/// `flashattn_fwd_args_t`. Start from `Default::default()` (= FLASHATTN_FWD_ARGS_INIT).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flashattn_fwd_args_t {
    pub struct_size: usize,
    pub q: *const c_void,
    pub k: *const c_void,
    pub v: *const c_void,
    pub o: *mut c_void,
    pub lse: *mut c_float,
    pub bias: *const c_void,
    pub alibi_slopes: *const c_float,
    pub cu_seqlens_q: *const i32,
    pub cu_seqlens_k: *const i32,
}

impl Default for flashattn_fwd_args_t {
    /// FLASHATTN_FWD_ARGS_INIT: struct_size set, every pointer NULL.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            q: core::ptr::null(),
            k: core::ptr::null(),
            v: core::ptr::null(),
            o: core::ptr::null_mut(),
            lse: core::ptr::null_mut(),
            bias: core::ptr::null(),
            alibi_slopes: core::ptr::null(),
            cu_seqlens_q: core::ptr::null(),
            cu_seqlens_k: core::ptr::null(),
        }
    }
}

/// `flashattn_bwd_args_t`. Start from `Default::default()` (= FLASHATTN_BWD_ARGS_INIT).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flashattn_bwd_args_t {
    pub struct_size: usize,
    pub q: *const c_void,
    pub k: *const c_void,
    pub v: *const c_void,
    pub o: *const c_void,
    pub lse: *const c_float,
    pub dout: *const c_void,
    pub dq: *mut c_void,
    pub dk: *mut c_void,
    pub dv: *mut c_void,
    pub bias: *const c_void,
    pub dbias: *mut c_void,
    pub alibi_slopes: *const c_float,
    pub cu_seqlens_q: *const i32,
    pub cu_seqlens_k: *const i32,
}

impl Default for flashattn_bwd_args_t {
    /// FLASHATTN_BWD_ARGS_INIT: struct_size set, every pointer NULL.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            q: core::ptr::null(),
            k: core::ptr::null(),
            v: core::ptr::null(),
            o: core::ptr::null(),
            lse: core::ptr::null(),
            dout: core::ptr::null(),
            dq: core::ptr::null_mut(),
            dk: core::ptr::null_mut(),
            dv: core::ptr::null_mut(),
            bias: core::ptr::null(),
            dbias: core::ptr::null_mut(),
            alibi_slopes: core::ptr::null(),
            cu_seqlens_q: core::ptr::null(),
            cu_seqlens_k: core::ptr::null(),
        }
    }
}

/// `flashattn_rotary_t`.
pub type flashattn_rotary_t = c_int;
pub const FLASHATTN_ROTARY_NONE: flashattn_rotary_t = 0;
pub const FLASHATTN_ROTARY_HALF: flashattn_rotary_t = 1;
pub const FLASHATTN_ROTARY_INTERLEAVED: flashattn_rotary_t = 2;
/// Not a value: keeps the C enum 32-bit.
pub const FLASHATTN_ROTARY_MAX_ENUM: flashattn_rotary_t = 0x7FFF_FFFF;

/// `flashattn_kvcache_config_t`. Start from `Default::default()` (= FLASHATTN_KVCACHE_CONFIG_INIT).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flashattn_kvcache_config_t {
    pub struct_size: usize,
    pub page_size: i64,
    pub num_rows: i64,
    pub max_pages_per_seq: i64,
    pub k_cache_strides: *const i64,
    pub v_cache_strides: *const i64,
    pub seqlen_new: i64,
    pub k_new_strides: *const i64,
    pub v_new_strides: *const i64,
    pub rotary: flashattn_rotary_t,
    pub rotary_dim: i64,
    pub rotary_rows: i64,
    pub num_splits: i64,
}

impl Default for flashattn_kvcache_config_t {
    /// FLASHATTN_KVCACHE_CONFIG_INIT: contiguous cache, no append, no rotary.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            page_size: 0,
            num_rows: 0,
            max_pages_per_seq: 0,
            k_cache_strides: core::ptr::null(),
            v_cache_strides: core::ptr::null(),
            seqlen_new: 0,
            k_new_strides: core::ptr::null(),
            v_new_strides: core::ptr::null(),
            rotary: FLASHATTN_ROTARY_NONE,
            rotary_dim: 0,
            rotary_rows: 0,
            num_splits: 0,
        }
    }
}

/// `flashattn_kvcache_args_t`. Start from `Default::default()` (= FLASHATTN_KVCACHE_ARGS_INIT).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flashattn_kvcache_args_t {
    pub struct_size: usize,
    pub q: *const c_void,
    pub k_cache: *mut c_void,
    pub v_cache: *mut c_void,
    pub o: *mut c_void,
    pub lse: *mut c_float,
    pub cache_seqlens: *const i32,
    pub cache_batch_idx: *const i32,
    pub block_table: *const i32,
    pub k_new: *const c_void,
    pub v_new: *const c_void,
    pub rotary_cos: *const c_void,
    pub rotary_sin: *const c_void,
    pub alibi_slopes: *const c_float,
}

impl Default for flashattn_kvcache_args_t {
    /// FLASHATTN_KVCACHE_ARGS_INIT: struct_size set, every pointer NULL.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            q: core::ptr::null(),
            k_cache: core::ptr::null_mut(),
            v_cache: core::ptr::null_mut(),
            o: core::ptr::null_mut(),
            lse: core::ptr::null_mut(),
            cache_seqlens: core::ptr::null(),
            cache_batch_idx: core::ptr::null(),
            block_table: core::ptr::null(),
            k_new: core::ptr::null(),
            v_new: core::ptr::null(),
            rotary_cos: core::ptr::null(),
            rotary_sin: core::ptr::null(),
            alibi_slopes: core::ptr::null(),
        }
    }
}

/// `flashattn_combine_args_t`. Start from `Default::default()` (= FLASHATTN_COMBINE_ARGS_INIT).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct flashattn_combine_args_t {
    pub struct_size: usize,
    pub num_splits: i64,
    pub batch: i64,
    pub seqlen_q: i64,
    pub heads: i64,
    pub head_dim: i64,
    pub o_partial: *const c_float,
    pub o_partial_strides: *const i64,
    pub lse_partial: *const c_float,
    pub lse_partial_strides: *const i64,
    pub dtype: flashattn_dtype_t,
    pub o: *mut c_void,
    pub o_strides: *const i64,
    pub lse: *mut c_float,
}

impl Default for flashattn_combine_args_t {
    /// FLASHATTN_COMBINE_ARGS_INIT: struct_size set, everything else 0 / NULL.
    fn default() -> Self {
        Self {
            struct_size: core::mem::size_of::<Self>(),
            num_splits: 0,
            batch: 0,
            seqlen_q: 0,
            heads: 0,
            head_dim: 0,
            o_partial: core::ptr::null(),
            o_partial_strides: core::ptr::null(),
            lse_partial: core::ptr::null(),
            lse_partial_strides: core::ptr::null(),
            dtype: FLASHATTN_DTYPE_FP16,
            o: core::ptr::null_mut(),
            o_strides: core::ptr::null(),
            lse: core::ptr::null_mut(),
        }
    }
}

extern "C" {
    pub fn flashattn_get_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int) -> c_int;
    pub fn flashattn_status_string(status: flashattn_status_t) -> *const c_char;
    pub fn flashattn_last_error() -> *const c_char;

    pub fn flashattn_plan_create(
        plan: *mut flashattn_plan_t,
        backend: flashattn_backend_t,
        device: c_int,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_destroy(plan: flashattn_plan_t);
    pub fn flashattn_plan_get_backend(plan: flashattn_plan_t, backend: *mut flashattn_backend_t) -> flashattn_status_t;
    pub fn flashattn_plan_set_shape(
        plan: flashattn_plan_t,
        batch: i64,
        seqlen_q: i64,
        seqlen_k: i64,
        heads_q: i64,
        heads_kv: i64,
        head_dim_qk: i64,
        head_dim_v: i64,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_set_dtype(plan: flashattn_plan_t, dtype: flashattn_dtype_t) -> flashattn_status_t;
    pub fn flashattn_plan_set_strides(
        plan: flashattn_plan_t,
        tensor: flashattn_tensor_t,
        strides: *const i64,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_set_softmax_scale(plan: flashattn_plan_t, scale: c_float) -> flashattn_status_t;
    pub fn flashattn_plan_set_algorithm(plan: flashattn_plan_t, algorithm: flashattn_algorithm_t)
        -> flashattn_status_t;
    pub fn flashattn_plan_set_varlen(
        plan: flashattn_plan_t,
        enabled: c_int,
        total_q: i64,
        total_k: i64,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_set_deterministic(plan: flashattn_plan_t, enabled: c_int) -> flashattn_status_t;
    pub fn flashattn_plan_set_grad_accumulate(plan: flashattn_plan_t, enabled: c_int) -> flashattn_status_t;
    pub fn flashattn_plan_set_band_mask(
        plan: flashattn_plan_t,
        align: flashattn_mask_align_t,
        window_left: i64,
        window_right: i64,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_set_softcap(plan: flashattn_plan_t, softcap: c_float) -> flashattn_status_t;
    pub fn flashattn_plan_set_bias(
        plan: flashattn_plan_t,
        kind: flashattn_bias_t,
        strides: *const i64,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_set_alibi_batch_stride(plan: flashattn_plan_t, batch_stride: i64) -> flashattn_status_t;
    pub fn flashattn_plan_set_dropout(plan: flashattn_plan_t, p: c_float, seed: u64, offset: u64)
        -> flashattn_status_t;
    pub fn flashattn_plan_set_block_sparse(
        plan: flashattn_plan_t,
        layout: *const u8,
        layout_heads: i64,
        num_row_blocks: i64,
        num_col_blocks: i64,
        block_q: i64,
        block_k: i64,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_get_workspace_size(
        plan: flashattn_plan_t,
        pass: flashattn_pass_t,
        bytes: *mut usize,
    ) -> flashattn_status_t;
    pub fn flashattn_fwd(
        plan: flashattn_plan_t,
        args: *const flashattn_fwd_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut CUstream_st,
    ) -> flashattn_status_t;
    pub fn flashattn_bwd(
        plan: flashattn_plan_t,
        args: *const flashattn_bwd_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut CUstream_st,
    ) -> flashattn_status_t;
    pub fn flashattn_plan_set_kvcache(
        plan: flashattn_plan_t,
        config: *const flashattn_kvcache_config_t,
    ) -> flashattn_status_t;
    pub fn flashattn_fwd_kvcache(
        plan: flashattn_plan_t,
        args: *const flashattn_kvcache_args_t,
        workspace: *mut c_void,
        workspace_bytes: usize,
        stream: *mut CUstream_st,
    ) -> flashattn_status_t;
    pub fn flashattn_combine(
        backend: flashattn_backend_t,
        device: c_int,
        args: *const flashattn_combine_args_t,
        stream: *mut CUstream_st,
    ) -> flashattn_status_t;
    pub fn flashattn_cuda_device_count() -> c_int;
    pub fn flashattn_has_cuda_backend() -> c_int;
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn args_layout_matches_the_header() {
        // 1 size_t + 9 pointers, and 1 size_t + 14 pointers: no padding anywhere.
        let w = core::mem::size_of::<usize>();
        assert_eq!(core::mem::size_of::<flashattn_fwd_args_t>(), 10 * w);
        assert_eq!(core::mem::size_of::<flashattn_bwd_args_t>(), 15 * w);
        assert_eq!(flashattn_fwd_args_t::default().struct_size, 10 * w);
        assert_eq!(flashattn_bwd_args_t::default().struct_size, 15 * w);
        // Inference structs on 64-bit targets: an int32 enum padded to 8 bytes in each.
        if w == 8 {
            assert_eq!(core::mem::size_of::<flashattn_kvcache_config_t>(), 13 * 8);
            assert_eq!(core::mem::size_of::<flashattn_kvcache_args_t>(), 14 * 8);
            assert_eq!(core::mem::size_of::<flashattn_combine_args_t>(), 14 * 8);
        }
    }

    #[test]
    fn linked_library_has_the_same_major_version() {
        let (mut a, mut b, mut c) = (-1, -1, -1);
        let n = unsafe { flashattn_get_version(&mut a, &mut b, &mut c) };
        assert_eq!(a, FLASHATTN_VERSION_MAJOR);
        assert!(b >= 0 && c >= 0);
        assert_eq!(n, a * 10000 + b * 100 + c);
        let name = unsafe { std::ffi::CStr::from_ptr(flashattn_status_string(FLASHATTN_STATUS_INVALID_SHAPE)) };
        assert_eq!(name.to_str().unwrap(), "FLASHATTN_STATUS_INVALID_SHAPE");
    }
}
