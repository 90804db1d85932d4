"""
    FlashAttn

Julia bindings of libflashattn (exact, IO-aware attention behind a stable C ABI) over
`@ccall`. Two layers:

* the raw C API: every function of `flashattn.h` with its C name (`flashattn_fwd`, ...),
  every enum value and macro as a constant (`FLASHATTN_STATUS_INVALID_SHAPE`, ...), and
  the argument structs `flashattn_fwd_args_t` / `flashattn_bwd_args_t` with the
  header's exact field order and types;
* a small Julian layer: `Plan` (finalized automatically), `FlashAttnError`,
  `forward!` / `backward!` on host `Array`s for the CPU backend, and inference:
  `set_kvcache!` / `forward_kvcache!` (KV cache, paged KV, append, rotary) and `combine!`.

Memory layout: Julia arrays are column-major, so a dense `Array{T,4}` of size
`(dim, heads, seq, batch)` is exactly the library's contiguous row-major
`[batch, seq, heads, dim]` (BSHD). LSE is `(seq_q, heads_q, batch)`.

The library is `ENV["FLASHATTN_LIBRARY"]` when the module is loaded (precompiled), else
`libflashattn.so.0` from the system loader. UNTESTED AT RUNTIME: no Julia runtime was
available where this was written; `check_against_header.py` checks it against the header.
"""
module FlashAttn

using Libdl

export Plan, FlashAttnError, forward!, backward!, set_shape!, set_dtype!, set_strides!, set_scale!,
       set_algorithm!, set_varlen!, set_deterministic!, set_grad_accumulate!, set_band_mask!, set_causal!, set_softcap!, set_bias!,
       set_alibi_batch_stride!, set_dropout!, set_block_sparse!, set_kvcache!, forward_kvcache!, combine!,
       workspace_size, backend, library_version, destroy!

"Path or SONAME of libflashattn."
const libflashattn = get(ENV, "FLASHATTN_LIBRARY", "libflashattn.so.0")

# ---------------------------------------------------------------- macros of flashattn.h

const FLASHATTN_VERSION_MAJOR = 0
const FLASHATTN_VERSION_MINOR = 1
const FLASHATTN_VERSION_PATCH = 0
const FLASHATTN_VERSION_NUMBER = FLASHATTN_VERSION_MAJOR * 10000 + FLASHATTN_VERSION_MINOR * 100 + FLASHATTN_VERSION_PATCH
const FLASHATTN_MAX_HEAD_DIM = 256
const FLASHATTN_WINDOW_UNBOUNDED = -1

# ---------------------------------------------------------------- C types

# C enums are passed as Cint.
const flashattn_status_t = Cint
const flashattn_backend_t = Cint
const flashattn_dtype_t = Cint
const flashattn_tensor_t = Cint
const flashattn_algorithm_t = Cint
const flashattn_mask_align_t = Cint
const flashattn_bias_t = Cint
const flashattn_pass_t = Cint
const flashattn_rotary_t = Cint
"Opaque plan handle (`struct flashattn_plan_s*`)."
const flashattn_plan_t = Ptr{Cvoid}
"`struct CUstream_st*`, i.e. cudaStream_t; C_NULL for the CPU backend or the default stream."
const CUstream = Ptr{Cvoid}

# flashattn_status_t
const FLASHATTN_STATUS_SUCCESS = Cint(0)
const FLASHATTN_STATUS_INVALID_ARGUMENT = Cint(100)
const FLASHATTN_STATUS_NULL_POINTER = Cint(101)
const FLASHATTN_STATUS_INVALID_SHAPE = Cint(102)
const FLASHATTN_STATUS_INVALID_HEADS = Cint(103)
const FLASHATTN_STATUS_INVALID_STRIDE = Cint(104)
const FLASHATTN_STATUS_INVALID_ENUM = Cint(105)
const FLASHATTN_STATUS_INVALID_VALUE = Cint(106)
const FLASHATTN_STATUS_INVALID_LAYOUT = Cint(107)
const FLASHATTN_STATUS_INVALID_STRUCT_SIZE = Cint(108)
const FLASHATTN_STATUS_WORKSPACE_TOO_SMALL = Cint(109)
const FLASHATTN_STATUS_PLAN_INCOMPLETE = Cint(110)
const FLASHATTN_STATUS_INCOMPATIBLE_OPTIONS = Cint(111)
const FLASHATTN_STATUS_INVALID_SEQLENS = Cint(112)
const FLASHATTN_STATUS_MISALIGNED_POINTER = Cint(113)
const FLASHATTN_STATUS_NOT_SUPPORTED = Cint(200)
const FLASHATTN_STATUS_BACKEND_UNAVAILABLE = Cint(201)
const FLASHATTN_STATUS_HEAD_DIM_NOT_SUPPORTED = Cint(202)
const FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED = Cint(203)
const FLASHATTN_STATUS_LIBRARY_UNAVAILABLE = Cint(204)
const FLASHATTN_STATUS_OUT_OF_MEMORY = Cint(300)
const FLASHATTN_STATUS_CUDA_ERROR = Cint(400)
const FLASHATTN_STATUS_NO_DEVICE = Cint(401)
const FLASHATTN_STATUS_LAUNCH_FAILED = Cint(402)
const FLASHATTN_STATUS_WRONG_MEMORY_SPACE = Cint(403)
const FLASHATTN_STATUS_INTERNAL_ERROR = Cint(900)
const FLASHATTN_STATUS_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_backend_t
const FLASHATTN_BACKEND_AUTO = Cint(0)
const FLASHATTN_BACKEND_CPU = Cint(1)
const FLASHATTN_BACKEND_CUDA = Cint(2)
const FLASHATTN_BACKEND_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_dtype_t
const FLASHATTN_DTYPE_FP16 = Cint(0)
const FLASHATTN_DTYPE_BF16 = Cint(1)
const FLASHATTN_DTYPE_FP32 = Cint(2)
const FLASHATTN_DTYPE_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_tensor_t
const FLASHATTN_TENSOR_Q = Cint(0)
const FLASHATTN_TENSOR_K = Cint(1)
const FLASHATTN_TENSOR_V = Cint(2)
const FLASHATTN_TENSOR_O = Cint(3)
const FLASHATTN_TENSOR_DO = Cint(4)
const FLASHATTN_TENSOR_DQ = Cint(5)
const FLASHATTN_TENSOR_DK = Cint(6)
const FLASHATTN_TENSOR_DV = Cint(7)
const FLASHATTN_TENSOR_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_algorithm_t
const FLASHATTN_ALGORITHM_FLASH = Cint(0)
const FLASHATTN_ALGORITHM_STANDARD = Cint(1)
const FLASHATTN_ALGORITHM_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_mask_align_t
const FLASHATTN_ALIGN_TOP_LEFT = Cint(0)
const FLASHATTN_ALIGN_BOTTOM_RIGHT = Cint(1)
const FLASHATTN_ALIGN_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_bias_t
const FLASHATTN_BIAS_NONE = Cint(0)
const FLASHATTN_BIAS_TENSOR = Cint(1)
const FLASHATTN_BIAS_ALIBI = Cint(2)
const FLASHATTN_BIAS_ALIBI_SYMMETRIC = Cint(3)
const FLASHATTN_BIAS_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_pass_t
const FLASHATTN_PASS_FORWARD = Cint(0)
const FLASHATTN_PASS_BACKWARD = Cint(1)
const FLASHATTN_PASS_FORWARD_KVCACHE = Cint(2)
const FLASHATTN_PASS_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# flashattn_rotary_t
const FLASHATTN_ROTARY_NONE = Cint(0)
const FLASHATTN_ROTARY_HALF = Cint(1)
const FLASHATTN_ROTARY_INTERLEAVED = Cint(2)
const FLASHATTN_ROTARY_MAX_ENUM = Cint(0x7FFFFFFF)  # not a value: keeps the C enum 32-bit

# ---------------------------------------------------------------- argument structs

"`flashattn_fwd_args_t`: pointers of one forward run (same field order and types as the header)."
struct flashattn_fwd_args_t
    struct_size::Csize_t
    q::Ptr{Cvoid}
    k::Ptr{Cvoid}
    v::Ptr{Cvoid}
    o::Ptr{Cvoid}
    lse::Ptr{Cfloat}
    bias::Ptr{Cvoid}
    alibi_slopes::Ptr{Cfloat}
    cu_seqlens_q::Ptr{Int32}
    cu_seqlens_k::Ptr{Int32}
end

"`flashattn_bwd_args_t`: pointers of one backward run (same field order and types as the header)."
struct flashattn_bwd_args_t
    struct_size::Csize_t
    q::Ptr{Cvoid}
    k::Ptr{Cvoid}
    v::Ptr{Cvoid}
    o::Ptr{Cvoid}
    lse::Ptr{Cfloat}
    dout::Ptr{Cvoid}
    dq::Ptr{Cvoid}
    dk::Ptr{Cvoid}
    dv::Ptr{Cvoid}
    bias::Ptr{Cvoid}
    dbias::Ptr{Cvoid}
    alibi_slopes::Ptr{Cfloat}
    cu_seqlens_q::Ptr{Int32}
    cu_seqlens_k::Ptr{Int32}
end

"""
    fwd_args(; q, k, v, o, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k)

FLASHATTN_FWD_ARGS_INIT with the given pointers (anything not given is NULL).
"""
fwd_args(; q=C_NULL, k=C_NULL, v=C_NULL, o=C_NULL, lse=C_NULL, bias=C_NULL, alibi_slopes=C_NULL,
         cu_seqlens_q=C_NULL, cu_seqlens_k=C_NULL) =
    flashattn_fwd_args_t(Csize_t(sizeof(flashattn_fwd_args_t)), Ptr{Cvoid}(q), Ptr{Cvoid}(k), Ptr{Cvoid}(v),
                         Ptr{Cvoid}(o), Ptr{Cfloat}(lse), Ptr{Cvoid}(bias), Ptr{Cfloat}(alibi_slopes),
                         Ptr{Int32}(cu_seqlens_q), Ptr{Int32}(cu_seqlens_k))

"""
    bwd_args(; q, k, v, o, lse, dout, dq, dk, dv, bias, dbias, alibi_slopes, cu_seqlens_q, cu_seqlens_k)

FLASHATTN_BWD_ARGS_INIT with the given pointers (anything not given is NULL).
"""
bwd_args(; q=C_NULL, k=C_NULL, v=C_NULL, o=C_NULL, lse=C_NULL, dout=C_NULL, dq=C_NULL, dk=C_NULL, dv=C_NULL,
         bias=C_NULL, dbias=C_NULL, alibi_slopes=C_NULL, cu_seqlens_q=C_NULL, cu_seqlens_k=C_NULL) =
    flashattn_bwd_args_t(Csize_t(sizeof(flashattn_bwd_args_t)), Ptr{Cvoid}(q), Ptr{Cvoid}(k), Ptr{Cvoid}(v),
                         Ptr{Cvoid}(o), Ptr{Cfloat}(lse), Ptr{Cvoid}(dout), Ptr{Cvoid}(dq), Ptr{Cvoid}(dk),
                         Ptr{Cvoid}(dv), Ptr{Cvoid}(bias), Ptr{Cvoid}(dbias), Ptr{Cfloat}(alibi_slopes),
                         Ptr{Int32}(cu_seqlens_q), Ptr{Int32}(cu_seqlens_k))

"`flashattn_kvcache_config_t`: KV-cache geometry of a plan (same field order and types as the header)."
struct flashattn_kvcache_config_t
    struct_size::Csize_t
    page_size::Int64
    num_rows::Int64
    max_pages_per_seq::Int64
    k_cache_strides::Ptr{Int64}
    v_cache_strides::Ptr{Int64}
    seqlen_new::Int64
    k_new_strides::Ptr{Int64}
    v_new_strides::Ptr{Int64}
    rotary::flashattn_rotary_t
    rotary_dim::Int64
    rotary_rows::Int64
    num_splits::Int64
end

"`flashattn_kvcache_args_t`: pointers and lengths of one KV-cache run (same field order and types as the header)."
struct flashattn_kvcache_args_t
    struct_size::Csize_t
    q::Ptr{Cvoid}
    k_cache::Ptr{Cvoid}
    v_cache::Ptr{Cvoid}
    o::Ptr{Cvoid}
    lse::Ptr{Cfloat}
    cache_seqlens::Ptr{Int32}
    cache_batch_idx::Ptr{Int32}
    block_table::Ptr{Int32}
    k_new::Ptr{Cvoid}
    v_new::Ptr{Cvoid}
    rotary_cos::Ptr{Cvoid}
    rotary_sin::Ptr{Cvoid}
    alibi_slopes::Ptr{Cfloat}
end

"`flashattn_combine_args_t`: shapes and pointers of a combine (same field order and types as the header)."
struct flashattn_combine_args_t
    struct_size::Csize_t
    num_splits::Int64
    batch::Int64
    seqlen_q::Int64
    heads::Int64
    head_dim::Int64
    o_partial::Ptr{Cfloat}
    o_partial_strides::Ptr{Int64}
    lse_partial::Ptr{Cfloat}
    lse_partial_strides::Ptr{Int64}
    dtype::flashattn_dtype_t
    o::Ptr{Cvoid}
    o_strides::Ptr{Int64}
    lse::Ptr{Cfloat}
end

"""
    kvcache_args(; q, k_cache, v_cache, o, lse, cache_seqlens, cache_batch_idx, block_table, k_new, v_new,
                 rotary_cos, rotary_sin, alibi_slopes)

FLASHATTN_KVCACHE_ARGS_INIT with the given pointers (anything not given is NULL).
"""
kvcache_args(; q=C_NULL, k_cache=C_NULL, v_cache=C_NULL, o=C_NULL, lse=C_NULL, cache_seqlens=C_NULL,
             cache_batch_idx=C_NULL, block_table=C_NULL, k_new=C_NULL, v_new=C_NULL, rotary_cos=C_NULL,
             rotary_sin=C_NULL, alibi_slopes=C_NULL) =
    flashattn_kvcache_args_t(Csize_t(sizeof(flashattn_kvcache_args_t)), Ptr{Cvoid}(q), Ptr{Cvoid}(k_cache),
                             Ptr{Cvoid}(v_cache), Ptr{Cvoid}(o), Ptr{Cfloat}(lse), Ptr{Int32}(cache_seqlens),
                             Ptr{Int32}(cache_batch_idx), Ptr{Int32}(block_table), Ptr{Cvoid}(k_new),
                             Ptr{Cvoid}(v_new), Ptr{Cvoid}(rotary_cos), Ptr{Cvoid}(rotary_sin),
                             Ptr{Cfloat}(alibi_slopes))

# ---------------------------------------------------------------- raw C functions

flashattn_get_version(major, minor, patch) =
    @ccall libflashattn.flashattn_get_version(major::Ptr{Cint}, minor::Ptr{Cint}, patch::Ptr{Cint})::Cint

flashattn_status_string(status) =
    @ccall libflashattn.flashattn_status_string(status::flashattn_status_t)::Cstring

flashattn_last_error() = @ccall libflashattn.flashattn_last_error()::Cstring

flashattn_plan_create(plan, backend, device) =
    @ccall libflashattn.flashattn_plan_create(plan::Ptr{flashattn_plan_t}, backend::flashattn_backend_t,
                                              device::Cint)::flashattn_status_t

flashattn_plan_destroy(plan) = @ccall libflashattn.flashattn_plan_destroy(plan::flashattn_plan_t)::Cvoid

flashattn_plan_get_backend(plan, backend) =
    @ccall libflashattn.flashattn_plan_get_backend(plan::flashattn_plan_t,
                                                   backend::Ptr{flashattn_backend_t})::flashattn_status_t

flashattn_plan_set_shape(plan, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v) =
    @ccall libflashattn.flashattn_plan_set_shape(plan::flashattn_plan_t, batch::Int64, seqlen_q::Int64,
                                                 seqlen_k::Int64, heads_q::Int64, heads_kv::Int64,
                                                 head_dim_qk::Int64, head_dim_v::Int64)::flashattn_status_t

flashattn_plan_set_dtype(plan, dtype) =
    @ccall libflashattn.flashattn_plan_set_dtype(plan::flashattn_plan_t, dtype::flashattn_dtype_t)::flashattn_status_t

flashattn_plan_set_strides(plan, tensor, strides) =
    @ccall libflashattn.flashattn_plan_set_strides(plan::flashattn_plan_t, tensor::flashattn_tensor_t,
                                                   strides::Ptr{Int64})::flashattn_status_t

flashattn_plan_set_softmax_scale(plan, scale) =
    @ccall libflashattn.flashattn_plan_set_softmax_scale(plan::flashattn_plan_t, scale::Cfloat)::flashattn_status_t

flashattn_plan_set_algorithm(plan, algorithm) =
    @ccall libflashattn.flashattn_plan_set_algorithm(plan::flashattn_plan_t,
                                                     algorithm::flashattn_algorithm_t)::flashattn_status_t

flashattn_plan_set_varlen(plan, enabled, total_q, total_k) =
    @ccall libflashattn.flashattn_plan_set_varlen(plan::flashattn_plan_t, enabled::Cint, total_q::Int64,
                                                  total_k::Int64)::flashattn_status_t

flashattn_plan_set_deterministic(plan, enabled) =
    @ccall libflashattn.flashattn_plan_set_deterministic(plan::flashattn_plan_t, enabled::Cint)::flashattn_status_t

flashattn_plan_set_grad_accumulate(plan, enabled) =
    @ccall libflashattn.flashattn_plan_set_grad_accumulate(plan::flashattn_plan_t, enabled::Cint)::flashattn_status_t

flashattn_plan_set_band_mask(plan, align, window_left, window_right) =
    @ccall libflashattn.flashattn_plan_set_band_mask(plan::flashattn_plan_t, align::flashattn_mask_align_t,
                                                     window_left::Int64, window_right::Int64)::flashattn_status_t

flashattn_plan_set_softcap(plan, softcap) =
    @ccall libflashattn.flashattn_plan_set_softcap(plan::flashattn_plan_t, softcap::Cfloat)::flashattn_status_t

flashattn_plan_set_bias(plan, kind, strides) =
    @ccall libflashattn.flashattn_plan_set_bias(plan::flashattn_plan_t, kind::flashattn_bias_t,
                                                strides::Ptr{Int64})::flashattn_status_t

flashattn_plan_set_alibi_batch_stride(plan, batch_stride) =
    @ccall libflashattn.flashattn_plan_set_alibi_batch_stride(plan::flashattn_plan_t,
                                                              batch_stride::Int64)::flashattn_status_t

flashattn_plan_set_dropout(plan, p, seed, offset) =
    @ccall libflashattn.flashattn_plan_set_dropout(plan::flashattn_plan_t, p::Cfloat, seed::UInt64,
                                                   offset::UInt64)::flashattn_status_t

flashattn_plan_set_block_sparse(plan, layout, layout_heads, num_row_blocks, num_col_blocks, block_q, block_k) =
    @ccall libflashattn.flashattn_plan_set_block_sparse(plan::flashattn_plan_t, layout::Ptr{UInt8},
                                                        layout_heads::Int64, num_row_blocks::Int64,
                                                        num_col_blocks::Int64, block_q::Int64,
                                                        block_k::Int64)::flashattn_status_t

flashattn_plan_get_workspace_size(plan, pass, bytes) =
    @ccall libflashattn.flashattn_plan_get_workspace_size(plan::flashattn_plan_t, pass::flashattn_pass_t,
                                                          bytes::Ptr{Csize_t})::flashattn_status_t

flashattn_fwd(plan, args, workspace, workspace_bytes, stream) =
    @ccall libflashattn.flashattn_fwd(plan::flashattn_plan_t, args::Ptr{flashattn_fwd_args_t}, workspace::Ptr{Cvoid},
                                      workspace_bytes::Csize_t, stream::CUstream)::flashattn_status_t

flashattn_bwd(plan, args, workspace, workspace_bytes, stream) =
    @ccall libflashattn.flashattn_bwd(plan::flashattn_plan_t, args::Ptr{flashattn_bwd_args_t}, workspace::Ptr{Cvoid},
                                      workspace_bytes::Csize_t, stream::CUstream)::flashattn_status_t

flashattn_plan_set_kvcache(plan, config) =
    @ccall libflashattn.flashattn_plan_set_kvcache(plan::flashattn_plan_t,
                                                   config::Ptr{flashattn_kvcache_config_t})::flashattn_status_t

flashattn_fwd_kvcache(plan, args, workspace, workspace_bytes, stream) =
    @ccall libflashattn.flashattn_fwd_kvcache(plan::flashattn_plan_t, args::Ptr{flashattn_kvcache_args_t},
                                              workspace::Ptr{Cvoid}, workspace_bytes::Csize_t,
                                              stream::CUstream)::flashattn_status_t

flashattn_combine(backend, device, args, stream) =
    @ccall libflashattn.flashattn_combine(backend::flashattn_backend_t, device::Cint,
                                          args::Ptr{flashattn_combine_args_t}, stream::CUstream)::flashattn_status_t

flashattn_cuda_device_count() = @ccall libflashattn.flashattn_cuda_device_count()::Cint

flashattn_has_cuda_backend() = @ccall libflashattn.flashattn_has_cuda_backend()::Cint

# ---------------------------------------------------------------- errors

"""
    FlashAttnError(status, name, message, func)

A failed call: `status` (e.g. 102), `name` ("FLASHATTN_STATUS_INVALID_SHAPE"), the
library's `message` naming the argument and value, and the C function `func`.
"""
struct FlashAttnError <: Exception
    status::Int
    name::String
    message::String
    func::Symbol
end

Base.showerror(io::IO, e::FlashAttnError) =
    print(io, "FlashAttnError: ", e.func, ": ", e.message, " (", e.name, ", status ", e.status, ")")

status_name(status::Integer) = unsafe_string(flashattn_status_string(Cint(status)))

function check(status::Integer, func::Symbol)
    status == FLASHATTN_STATUS_SUCCESS && return nothing
    msg = unsafe_string(flashattn_last_error())
    throw(FlashAttnError(Int(status), status_name(status), msg, func))
end

binding_error(status, msg) = throw(FlashAttnError(Int(status), status_name(status), msg, :FlashAttn))

"`(major, minor, patch)` of the loaded library."
function library_version()
    a, b, c = Ref{Cint}(0), Ref{Cint}(0), Ref{Cint}(0)
    flashattn_get_version(a, b, c)
    return (Int(a[]), Int(b[]), Int(c[]))
end

function __init__()
    major = library_version()[1]
    major == FLASHATTN_VERSION_MAJOR ||
        error("FlashAttn: $(libflashattn) has major version $(major); these bindings need $(FLASHATTN_VERSION_MAJOR)")
end

# ---------------------------------------------------------------- Plan

dtype_of(::Type{Float32}) = FLASHATTN_DTYPE_FP32
dtype_of(::Type{Float16}) = FLASHATTN_DTYPE_FP16
dtype_of(::Type{T}) where {T} = binding_error(FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
                                              "element type $(T) is not supported (Float32, Float16, or UInt16 bfloat16 bits with dtype=FLASHATTN_DTYPE_BF16)")

"""
    Plan(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v=head_dim_qk;
         dtype=FLASHATTN_DTYPE_FP32, backend=FLASHATTN_BACKEND_CPU, device=0)

An attention problem; destroyed by the garbage collector or by `destroy!`.
"""
mutable struct Plan
    handle::flashattn_plan_t
    shape::NTuple{7,Int64}
    dtype::Cint
    varlen::Union{Nothing,Tuple{Int64,Int64}}
    kvcache::Union{Nothing,NamedTuple}
    function Plan(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v=head_dim_qk;
                  dtype=FLASHATTN_DTYPE_FP32, backend=FLASHATTN_BACKEND_CPU, device=0)
        h = Ref{flashattn_plan_t}(C_NULL)
        check(flashattn_plan_create(h, Cint(backend), Cint(device)), :flashattn_plan_create)
        p = new(h[], (0, 0, 0, 0, 0, 0, 0), FLASHATTN_DTYPE_FP16, nothing, nothing)
        finalizer(destroy!, p)
        set_shape!(p, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v)
        set_dtype!(p, dtype)
        return p
    end
end

"Destroy the C plan now (idempotent)."
function destroy!(p::Plan)
    if p.handle != C_NULL
        flashattn_plan_destroy(p.handle)
        p.handle = C_NULL
    end
    return nothing
end

handle(p::Plan) = p.handle == C_NULL ? binding_error(FLASHATTN_STATUS_NULL_POINTER, "plan has been destroyed") :
                  p.handle

"The resolved backend (FLASHATTN_BACKEND_CPU or FLASHATTN_BACKEND_CUDA)."
function backend(p::Plan)
    b = Ref{flashattn_backend_t}(0)
    check(flashattn_plan_get_backend(handle(p), b), :flashattn_plan_get_backend)
    return b[]
end

function set_shape!(p::Plan, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v=head_dim_qk)
    s = Int64.((batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim_qk, head_dim_v))
    check(flashattn_plan_set_shape(handle(p), s...), :flashattn_plan_set_shape)
    p.shape = s
    return p
end

function set_dtype!(p::Plan, dtype)
    check(flashattn_plan_set_dtype(handle(p), Cint(dtype)), :flashattn_plan_set_dtype)
    p.dtype = Cint(dtype)
    return p
end

"Strides in elements in the order (batch, seq, head, dim); the dim stride must be 1."
function set_strides!(p::Plan, tensor, strides)
    s = Int64[strides...]
    length(s) == 4 || binding_error(FLASHATTN_STATUS_INVALID_ARGUMENT, "strides must have 4 entries, got $(length(s))")
    GC.@preserve s check(flashattn_plan_set_strides(handle(p), Cint(tensor), pointer(s)), :flashattn_plan_set_strides)
    return p
end

set_scale!(p::Plan, scale) =
    (check(flashattn_plan_set_softmax_scale(handle(p), Cfloat(scale)), :flashattn_plan_set_softmax_scale); p)

set_algorithm!(p::Plan, algorithm) =
    (check(flashattn_plan_set_algorithm(handle(p), Cint(algorithm)), :flashattn_plan_set_algorithm); p)

function set_varlen!(p::Plan, totals::Union{Nothing,Tuple{<:Integer,<:Integer}})
    if totals === nothing
        check(flashattn_plan_set_varlen(handle(p), Cint(0), Int64(0), Int64(0)), :flashattn_plan_set_varlen)
    else
        check(flashattn_plan_set_varlen(handle(p), Cint(1), Int64(totals[1]), Int64(totals[2])),
              :flashattn_plan_set_varlen)
    end
    p.varlen = totals === nothing ? nothing : (Int64(totals[1]), Int64(totals[2]))
    return p
end

set_deterministic!(p::Plan, enabled::Bool=true) =
    (check(flashattn_plan_set_deterministic(handle(p), Cint(enabled)), :flashattn_plan_set_deterministic); p)

"The backward adds its gradients to dq, dk, dv (fp32 sum, rounded once) instead of overwriting them."
set_grad_accumulate!(p::Plan, enabled::Bool=true) =
    (check(flashattn_plan_set_grad_accumulate(handle(p), Cint(enabled)), :flashattn_plan_set_grad_accumulate); p)

set_band_mask!(p::Plan, align, window_left, window_right) =
    (check(flashattn_plan_set_band_mask(handle(p), Cint(align), Int64(window_left), Int64(window_right)),
           :flashattn_plan_set_band_mask); p)

"Causal mask (window_left unbounded, window_right 0)."
set_causal!(p::Plan, align=FLASHATTN_ALIGN_TOP_LEFT) = set_band_mask!(p, align, FLASHATTN_WINDOW_UNBOUNDED, 0)

set_softcap!(p::Plan, softcap) =
    (check(flashattn_plan_set_softcap(handle(p), Cfloat(softcap)), :flashattn_plan_set_softcap); p)

"Bias kind; `strides` (batch, head, q, k) only for FLASHATTN_BIAS_TENSOR."
function set_bias!(p::Plan, kind, strides=nothing)
    if strides === nothing
        check(flashattn_plan_set_bias(handle(p), Cint(kind), Ptr{Int64}(C_NULL)), :flashattn_plan_set_bias)
    else
        s = Int64[strides...]
        GC.@preserve s check(flashattn_plan_set_bias(handle(p), Cint(kind), pointer(s)), :flashattn_plan_set_bias)
    end
    return p
end

"ALiBi slopes per (sequence, head), rows `batch_stride` elements apart (0: one per head); after set_bias!."
set_alibi_batch_stride!(p::Plan, batch_stride::Integer) =
    (check(flashattn_plan_set_alibi_batch_stride(handle(p), Int64(batch_stride)),
           :flashattn_plan_set_alibi_batch_stride); p)

set_dropout!(p::Plan, prob, seed::Integer=0, offset::Integer=0) =
    (check(flashattn_plan_set_dropout(handle(p), Cfloat(prob), UInt64(seed), UInt64(offset)),
           :flashattn_plan_set_dropout); p)

"""
    set_block_sparse!(p, layout::Array{UInt8,3}, block_q, block_k)

`layout` in Julia order `(num_col_blocks, num_row_blocks, layout_heads)` (column-major view
of the C layout). `nothing` clears.
"""
function set_block_sparse!(p::Plan, layout, block_q=0, block_k=0)
    if layout === nothing
        check(flashattn_plan_set_block_sparse(handle(p), Ptr{UInt8}(C_NULL), 0, 0, 0, 0, 0),
              :flashattn_plan_set_block_sparse)
        return p
    end
    l = convert(Array{UInt8,3}, layout)
    cols, rows, heads = size(l)
    GC.@preserve l check(flashattn_plan_set_block_sparse(handle(p), pointer(l), Int64(heads), Int64(rows),
                                                         Int64(cols), Int64(block_q), Int64(block_k)),
                         :flashattn_plan_set_block_sparse)
    return p
end

"""
    set_kvcache!(p, num_rows; page_size=0, max_pages_per_seq=0, seqlen_new=0, rotary=FLASHATTN_ROTARY_NONE,
                 rotary_dim=0, rotary_rows=0, num_splits=0)
    set_kvcache!(p, nothing)

KV-cache mode (docs/inference.md) with dense caches and new keys/values: the plan's
seqlen_q is the new query tokens per sequence, its seqlen_k the capacity of one sequence.
`num_rows` cache rows, or pages in the pool with `page_size >= 1` (then
`max_pages_per_seq` is the block table's width); `seqlen_new` tokens appended per run;
`rotary` (FLASHATTN_ROTARY_HALF or _INTERLEAVED) with `rotary_dim` and `rotary_rows`;
`num_splits` 0 lets the library choose. `nothing` leaves KV-cache mode.
"""
function set_kvcache!(p::Plan, num_rows::Integer; page_size=0, max_pages_per_seq=0, seqlen_new=0,
                      rotary=FLASHATTN_ROTARY_NONE, rotary_dim=0, rotary_rows=0, num_splits=0)
    none = Ptr{Int64}(C_NULL)
    cfg = Ref(flashattn_kvcache_config_t(Csize_t(sizeof(flashattn_kvcache_config_t)), Int64(page_size),
                                         Int64(num_rows), Int64(max_pages_per_seq), none, none, Int64(seqlen_new),
                                         none, none, Cint(rotary), Int64(rotary_dim), Int64(rotary_rows),
                                         Int64(num_splits)))
    check(flashattn_plan_set_kvcache(handle(p), cfg), :flashattn_plan_set_kvcache)
    p.kvcache = (page_size=Int64(page_size), num_rows=Int64(num_rows), max_pages=Int64(max_pages_per_seq),
                 seqlen_new=Int64(seqlen_new), rotary_dim=Int64(rotary_dim), rotary_rows=Int64(rotary_rows))
    return p
end

function set_kvcache!(p::Plan, ::Nothing)
    check(flashattn_plan_set_kvcache(handle(p), Ptr{flashattn_kvcache_config_t}(C_NULL)), :flashattn_plan_set_kvcache)
    p.kvcache = nothing
    return p
end

"Workspace bytes of a pass (FLASHATTN_PASS_FORWARD, FLASHATTN_PASS_BACKWARD or FLASHATTN_PASS_FORWARD_KVCACHE)."
function workspace_size(p::Plan, pass=FLASHATTN_PASS_FORWARD)
    n = Ref{Csize_t}(0)
    check(flashattn_plan_get_workspace_size(handle(p), Cint(pass), n), :flashattn_plan_get_workspace_size)
    return Int(n[])
end

# ---------------------------------------------------------------- runs on host arrays

function expect_size(name, x, want)
    size(x) == want ||
        binding_error(FLASHATTN_STATUS_INVALID_SHAPE, "$(name) has size $(size(x)); the plan needs $(want)")
end

function check_element(p::Plan, name, x)
    T = eltype(x)
    ok = (T === UInt16 && p.dtype == FLASHATTN_DTYPE_BF16) || (T !== UInt16 && dtype_of(T) == p.dtype)
    ok || binding_error(FLASHATTN_STATUS_INVALID_ARGUMENT, "$(name) has element type $(T), which is not the plan's dtype $(p.dtype)")
end

# Julia sizes (column-major) of each tensor for contiguous default strides.
function julia_sizes(p::Plan)
    b, sq, sk, hq, hkv, dqk, dv = p.shape
    if p.varlen === nothing
        return (q=(dqk, hq, sq, b), k=(dqk, hkv, sk, b), v=(dv, hkv, sk, b), o=(dv, hq, sq, b), lse=(sq, hq, b))
    end
    tq, tk = p.varlen
    return (q=(dqk, hq, tq), k=(dqk, hkv, tk), v=(dv, hkv, tk), o=(dv, hq, tq), lse=(tq, hq))
end

ptr_or_null(x) = x === nothing ? C_NULL : pointer(x)

require_host(p::Plan) = backend(p) == FLASHATTN_BACKEND_CPU ||
    binding_error(FLASHATTN_STATUS_WRONG_MEMORY_SPACE, "Arrays are host memory; this plan runs on CUDA")

function check_float32(name, x, want)
    x === nothing && return nothing
    expect_size(name, x, want)
    eltype(x) === Float32 || binding_error(FLASHATTN_STATUS_INVALID_ARGUMENT, "$(name) must be Float32")
end

"""
    forward!(p, out, q, k, v; lse=nothing, bias=nothing, alibi_slopes=nothing,
             cu_seqlens_q=nothing, cu_seqlens_k=nothing)

Forward pass on dense host `Array`s (CPU backend, contiguous default strides): q is
`(head_dim_qk, heads_q, seqlen_q, batch)` (or `(dim, heads, tokens)` in varlen mode).
Writes `out` and, if given, `lse`. Returns `out`.
"""
function forward!(p::Plan, out::Array, q::Array, k::Array, v::Array; lse=nothing, bias=nothing,
                  alibi_slopes=nothing, cu_seqlens_q=nothing, cu_seqlens_k=nothing)
    require_host(p)
    sz = julia_sizes(p)
    for (name, x, want) in ((:q, q, sz.q), (:k, k, sz.k), (:v, v, sz.v), (:out, out, sz.o))
        expect_size(name, x, want)
        check_element(p, name, x)
    end
    check_float32(:lse, lse, sz.lse)
    check_float32(:alibi_slopes, alibi_slopes, (p.shape[4],))
    for (name, c) in ((:cu_seqlens_q, cu_seqlens_q), (:cu_seqlens_k, cu_seqlens_k))
        c === nothing || (eltype(c) === Int32 && length(c) == p.shape[1] + 1) ||
            binding_error(FLASHATTN_STATUS_INVALID_SHAPE, "$(name) must be Int32 of length batch+1")
    end
    ws = Vector{UInt8}(undef, workspace_size(p, FLASHATTN_PASS_FORWARD))
    GC.@preserve out q k v lse bias alibi_slopes cu_seqlens_q cu_seqlens_k ws begin
        args = Ref(fwd_args(q=pointer(q), k=pointer(k), v=pointer(v), o=pointer(out), lse=ptr_or_null(lse),
                            bias=ptr_or_null(bias), alibi_slopes=ptr_or_null(alibi_slopes),
                            cu_seqlens_q=ptr_or_null(cu_seqlens_q), cu_seqlens_k=ptr_or_null(cu_seqlens_k)))
        wp = isempty(ws) ? C_NULL : pointer(ws)
        check(flashattn_fwd(handle(p), args, wp, Csize_t(length(ws)), CUstream(C_NULL)), :flashattn_fwd)
    end
    return out
end

"""
    backward!(p, dq, dk, dv, q, k, v, out, lse, dout; bias=nothing, dbias=nothing,
              alibi_slopes=nothing, cu_seqlens_q=nothing, cu_seqlens_k=nothing)

Backward pass on dense host `Array`s (CPU backend). Returns `(dq, dk, dv)`.
"""
function backward!(p::Plan, dq::Array, dk::Array, dv::Array, q::Array, k::Array, v::Array, out::Array,
                   lse::Array{Float32}, dout::Array; bias=nothing, dbias=nothing, alibi_slopes=nothing,
                   cu_seqlens_q=nothing, cu_seqlens_k=nothing)
    require_host(p)
    sz = julia_sizes(p)
    for (name, x, want) in ((:q, q, sz.q), (:k, k, sz.k), (:v, v, sz.v), (:out, out, sz.o), (:dout, dout, sz.o),
                            (:dq, dq, sz.q), (:dk, dk, sz.k), (:dv, dv, sz.v))
        expect_size(name, x, want)
        check_element(p, name, x)
    end
    expect_size(:lse, lse, sz.lse)
    ws = Vector{UInt8}(undef, workspace_size(p, FLASHATTN_PASS_BACKWARD))
    GC.@preserve dq dk dv q k v out lse dout bias dbias alibi_slopes cu_seqlens_q cu_seqlens_k ws begin
        args = Ref(bwd_args(q=pointer(q), k=pointer(k), v=pointer(v), o=pointer(out), lse=pointer(lse),
                            dout=pointer(dout), dq=pointer(dq), dk=pointer(dk), dv=pointer(dv),
                            bias=ptr_or_null(bias), dbias=ptr_or_null(dbias),
                            alibi_slopes=ptr_or_null(alibi_slopes), cu_seqlens_q=ptr_or_null(cu_seqlens_q),
                            cu_seqlens_k=ptr_or_null(cu_seqlens_k)))
        wp = isempty(ws) ? C_NULL : pointer(ws)
        check(flashattn_bwd(handle(p), args, wp, Csize_t(length(ws)), CUstream(C_NULL)), :flashattn_bwd)
    end
    return dq, dk, dv
end

# Julia sizes (column-major) of the KV-cache run's arrays for the plan's configuration.
function kvcache_sizes(p::Plan)
    kv = p.kvcache
    kv === nothing && binding_error(FLASHATTN_STATUS_PLAN_INCOMPLETE,
                                    "the plan has no KV-cache configuration: call set_kvcache! first")
    b, sq, sk, hq, hkv, dqk, dv = p.shape
    tokens = kv.page_size > 0 ? kv.page_size : sk
    return (k_cache=(dqk, hkv, tokens, kv.num_rows), v_cache=(dv, hkv, tokens, kv.num_rows),
            k_new=(dqk, hkv, kv.seqlen_new, b), v_new=(dv, hkv, kv.seqlen_new, b),
            rotary=(kv.rotary_dim ÷ 2, kv.rotary_rows), per_seq=(b,), block_table=(kv.max_pages, b))
end

"""
    forward_kvcache!(p, out, q, k_cache, v_cache, cache_seqlens; lse=nothing, cache_batch_idx=nothing,
                     block_table=nothing, k_new=nothing, v_new=nothing, rotary_cos=nothing,
                     rotary_sin=nothing, alibi_slopes=nothing)

One KV-cache run on dense host `Array`s (CPU backend): append `k_new`/`v_new` (rotated)
into the caches at each sequence's `cache_seqlens`, rotate q, attend to the first
`cache_seqlens[b] + seqlen_new` keys. Julia sizes: q `(head_dim_qk, heads_q, seqlen_q,
batch)`; caches `(head_dim, heads_kv, seqlen_k or page_size, num_rows)`; `k_new`/`v_new`
`(head_dim, heads_kv, seqlen_new, batch)`; `cache_seqlens`/`cache_batch_idx` Int32
`(batch,)`; `block_table` Int32 `(max_pages_per_seq, batch)`; rotary tables
`(rotary_dim / 2, rotary_rows)`. Writes `out` (and `lse`); returns `out`.
"""
function forward_kvcache!(p::Plan, out::Array, q::Array, k_cache::Array, v_cache::Array, cache_seqlens::Array;
                          lse=nothing, cache_batch_idx=nothing, block_table=nothing, k_new=nothing, v_new=nothing,
                          rotary_cos=nothing, rotary_sin=nothing, alibi_slopes=nothing)
    require_host(p)
    sz, kz = julia_sizes(p), kvcache_sizes(p)
    for (name, x, want) in ((:q, q, sz.q), (:out, out, sz.o), (:k_cache, k_cache, kz.k_cache),
                            (:v_cache, v_cache, kz.v_cache), (:k_new, k_new, kz.k_new), (:v_new, v_new, kz.v_new),
                            (:rotary_cos, rotary_cos, kz.rotary), (:rotary_sin, rotary_sin, kz.rotary))
        x === nothing && continue
        expect_size(name, x, want)
        check_element(p, name, x)
    end
    for (name, x, want) in ((:cache_seqlens, cache_seqlens, kz.per_seq),
                            (:cache_batch_idx, cache_batch_idx, kz.per_seq), (:block_table, block_table, kz.block_table))
        x === nothing && continue
        expect_size(name, x, want)
        eltype(x) === Int32 || binding_error(FLASHATTN_STATUS_INVALID_ARGUMENT, "$(name) must be Int32")
    end
    check_float32(:lse, lse, sz.lse)
    check_float32(:alibi_slopes, alibi_slopes, (p.shape[4],))
    ws = Vector{UInt8}(undef, workspace_size(p, FLASHATTN_PASS_FORWARD_KVCACHE))
    GC.@preserve(out, q, k_cache, v_cache, cache_seqlens, lse, cache_batch_idx, block_table, k_new, v_new, rotary_cos,
                 rotary_sin, alibi_slopes, ws, begin
        args = Ref(kvcache_args(q=pointer(q), k_cache=pointer(k_cache), v_cache=pointer(v_cache), o=pointer(out),
                                lse=ptr_or_null(lse), cache_seqlens=pointer(cache_seqlens),
                                cache_batch_idx=ptr_or_null(cache_batch_idx), block_table=ptr_or_null(block_table),
                                k_new=ptr_or_null(k_new), v_new=ptr_or_null(v_new),
                                rotary_cos=ptr_or_null(rotary_cos), rotary_sin=ptr_or_null(rotary_sin),
                                alibi_slopes=ptr_or_null(alibi_slopes)))
        wp = isempty(ws) ? C_NULL : pointer(ws)
        check(flashattn_fwd_kvcache(handle(p), args, wp, Csize_t(length(ws)), CUstream(C_NULL)),
              :flashattn_fwd_kvcache)
    end)
    return out
end

"""
    combine!(o, o_partial, lse_partial; lse=nothing, dtype=nothing)

Merge partial results over a split of the keys on the CPU (`flashattn_combine`): per row,
over the parts whose LSE is not -Inf, lse = log(sum(exp(lse_i))) and
O = sum(exp(lse_i - lse) * O_i); a row with no part gets O = 0 and LSE = -Inf.
Julia sizes: `o_partial` Float32 `(head_dim, heads, seqlen_q, batch, num_splits)`,
`lse_partial` Float32 `(seqlen_q, heads, batch, num_splits)`, `o` `(head_dim, heads,
seqlen_q, batch)` of Float32 or Float16 (UInt16 bfloat16 bits with
`dtype=FLASHATTN_DTYPE_BF16`), `lse` Float32 `(seqlen_q, heads, batch)`. Returns `o`.
"""
function combine!(o::Array, o_partial::Array{Float32,5}, lse_partial::Array{Float32,4}; lse=nothing, dtype=nothing)
    d, h, sq, b, n = size(o_partial)
    expect_size(:lse_partial, lse_partial, (sq, h, b, n))
    expect_size(:o, o, (d, h, sq, b))
    check_float32(:lse, lse, (sq, h, b))
    dt = dtype === nothing ? dtype_of(eltype(o)) : Cint(dtype)
    none = Ptr{Int64}(C_NULL)
    GC.@preserve o o_partial lse_partial lse begin
        args = Ref(flashattn_combine_args_t(Csize_t(sizeof(flashattn_combine_args_t)), Int64(n), Int64(b), Int64(sq),
                                            Int64(h), Int64(d), pointer(o_partial), none, pointer(lse_partial), none,
                                            dt, Ptr{Cvoid}(pointer(o)), none, Ptr{Cfloat}(ptr_or_null(lse))))
        check(flashattn_combine(FLASHATTN_BACKEND_CPU, Cint(0), args, CUstream(C_NULL)), :flashattn_combine)
    end
    return o
end

end # module
