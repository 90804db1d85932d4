# The package's tests (Pkg.test, or run_tests.sh for CTest): real calls on the CPU backend
# checked against a naive Float64 attention written from the header's semantics, and the
# error statuses of the library and of the binding's own checks.
#
#   FLASHATTN_LIBRARY=build/cpu/libflashattn.so.0 julia --project=bindings/julia bindings/julia/test/runtests.jl
using Test
using FlashAttn
const FA = FlashAttn

"Deterministic values in [-1, 1] of the given Julia size."
data(dims, seed) = reshape(Float32[sin(0.37f0 * seed * i + seed) for i in 1:prod(dims)], dims)

"Largest |a - b|, equal entries (infinities included) counting 0."
maxerr(a, b) = maximum(x == y ? 0.0 : abs(Float64(x) - Float64(y)) for (x, y) in zip(a, b))

"""
Attention in Float64 on Julia-order arrays (q `(d, heads_q, seq_q, batch)`, k `(d, heads_kv,
seq_k, batch)`, v `(dv, heads_kv, seq_k, batch)`): out, lse and the gradients for `dout`.
`causal` is `nothing` or a FLASHATTN_ALIGN_* value; a row with no key gets out 0, lse -Inf.
"""
function reference(q, k, v, dout; causal=nothing, scale=1 / sqrt(size(q, 1)))
    d, hq, sq, b = size(q)
    dv, hkv, sk, _ = size(v)
    group = hq ÷ hkv
    shift = causal == FA.FLASHATTN_ALIGN_BOTTOM_RIGHT ? sk - sq : 0
    o, lse = zeros(dv, hq, sq, b), zeros(sq, hq, b)
    dq, dk, dvv = zeros(size(q)), zeros(size(k)), zeros(size(v))
    for bi in 1:b, h in 1:hq, i in 1:sq
        hk = (h - 1) ÷ group + 1
        keep(j) = causal === nothing || j - 1 <= i - 1 + shift
        s = [keep(j) ? scale * sum(Float64(q[x, h, i, bi]) * k[x, hk, j, bi] for x in 1:d) : -Inf for j in 1:sk]
        m = maximum(s)
        if m == -Inf
            lse[i, h, bi] = -Inf
            continue
        end
        e = exp.(s .- m)
        p = e ./ sum(e)
        lse[i, h, bi] = m + log(sum(e))
        for x in 1:dv
            o[x, h, i, bi] = sum(p[j] * v[x, hk, j, bi] for j in 1:sk)
        end
        dp = [sum(Float64(dout[x, h, i, bi]) * v[x, hk, j, bi] for x in 1:dv) for j in 1:sk]
        delta = sum(p .* dp)
        for j in 1:sk
            ds = p[j] * (dp[j] - delta)
            for x in 1:dv
                dvv[x, hk, j, bi] += p[j] * dout[x, h, i, bi]
            end
            for x in 1:d
                dq[x, h, i, bi] += scale * ds * k[x, hk, j, bi]
                dk[x, hk, j, bi] += scale * ds * q[x, h, i, bi]
            end
        end
    end
    return (o=o, lse=lse, dq=dq, dk=dk, dv=dvv)
end

"The exception `f()` throws (nothing if it returns)."
caught(f) = try
    f()
    nothing
catch err
    err
end

"A FlashAttnError with this status, status name and function, whose message contains `part`."
function is_error(e, status, func, part="")
    e isa FlashAttnError || return false
    return e.status == status && e.name == unsafe_string(FA.flashattn_status_string(Cint(status))) &&
           e.func == func && occursin(part, e.message)
end

"bfloat16 bits of `x` (round to nearest, ties to even; no NaN here) and back."
bf16(x::Float32) = (u = reinterpret(UInt32, x); UInt16((u + 0x00007fff + ((u >> 16) & 0x00000001)) >> 16))
f32(h::UInt16) = reinterpret(Float32, UInt32(h) << 16)

"Forward and backward of one FP32 problem against the reference."
function run_case(b, sq, sk, hq, hkv, d, dv; causal=nothing, scale=nothing)
    plan = Plan(b, sq, sk, hq, hkv, d, dv)
    causal === nothing || set_causal!(plan, causal)
    scale === nothing || set_scale!(plan, scale)
    q, k, v = data((d, hq, sq, b), 1), data((d, hkv, sk, b), 2), data((dv, hkv, sk, b), 3)
    dout = data((dv, hq, sq, b), 4)
    out, lse = fill(NaN32, dv, hq, sq, b), fill(NaN32, sq, hq, b)
    @test forward!(plan, out, q, k, v; lse=lse) === out
    dq, dk, dvv = zeros(Float32, size(q)), zeros(Float32, size(k)), zeros(Float32, size(v))
    @test backward!(plan, dq, dk, dvv, q, k, v, out, lse, dout) == (dq, dk, dvv)
    r = reference(q, k, v, dout; causal=causal, scale=scale === nothing ? 1 / sqrt(d) : Float64(Float32(scale)))
    @test maxerr(out, r.o) < 2e-5
    @test maxerr(lse, r.lse) < 2e-5
    @test maxerr(dq, r.dq) < 1e-4
    @test maxerr(dk, r.dk) < 1e-4
    @test maxerr(dvv, r.dv) < 1e-4
    destroy!(plan)
end

@testset "FlashAttn" begin
    @testset "library" begin
        @test library_version()[1] == FA.FLASHATTN_VERSION_MAJOR
        plan = Plan(1, 8, 8, 2, 2, 8)
        @test backend(plan) == FA.FLASHATTN_BACKEND_CPU
        @test workspace_size(plan) >= 0
        @test workspace_size(plan, FA.FLASHATTN_PASS_BACKWARD) >= 0
    end

    @testset "forward and backward against the reference" begin
        run_case(2, 17, 23, 3, 3, 16, 16)
        run_case(1, 21, 21, 4, 2, 8, 12; causal=FA.FLASHATTN_ALIGN_TOP_LEFT, scale=0.37)
        run_case(1, 12, 7, 2, 1, 8, 8; causal=FA.FLASHATTN_ALIGN_BOTTOM_RIGHT)
    end

    @testset "rows that see no key" begin
        # seqlen_q > seqlen_k aligned bottom-right: the first 5 query rows see no key.
        plan = set_causal!(Plan(1, 12, 7, 2, 1, 8), FA.FLASHATTN_ALIGN_BOTTOM_RIGHT)
        out, lse = fill(1.0f0, 8, 2, 12, 1), zeros(Float32, 12, 2, 1)
        forward!(plan, out, data((8, 2, 12, 1), 9), data((8, 1, 7, 1), 8), data((8, 1, 7, 1), 7); lse=lse)
        @test all(out[:, :, 1:5, :] .== 0)
        @test all(lse[1:5, :, :] .== -Inf32)
        @test all(isfinite, lse[6:end, :, :])
    end

    @testset "16-bit element types" begin
        q, k, v = data((32, 2, 16, 1), 11), data((32, 2, 16, 1), 12), data((32, 2, 16, 1), 13)
        zero_dout = zeros(Float32, 32, 2, 16, 1)

        plan = Plan(1, 16, 16, 2, 2, 32; dtype=FA.FLASHATTN_DTYPE_FP16)
        qh, kh, vh = Float16.(q), Float16.(k), Float16.(v)
        out = zeros(Float16, 32, 2, 16, 1)
        forward!(plan, out, qh, kh, vh)
        r = reference(Float32.(qh), Float32.(kh), Float32.(vh), zero_dout)
        @test maxerr(out, r.o) < 2e-3

        plan = Plan(1, 16, 16, 2, 2, 32; dtype=FA.FLASHATTN_DTYPE_BF16)
        qb, kb, vb = bf16.(q), bf16.(k), bf16.(v)
        out = zeros(UInt16, 32, 2, 16, 1)
        forward!(plan, out, qb, kb, vb)
        r = reference(f32.(qb), f32.(kb), f32.(vb), zero_dout)
        @test maxerr(f32.(out), r.o) < 8e-3
    end

    @testset "dropout is keyed by (seed, offset)" begin
        q, k, v = data((8, 2, 16, 1), 1), data((8, 2, 16, 1), 2), data((8, 2, 16, 1), 3)
        fwd(seed, offset, p=0.3) = forward!(set_dropout!(Plan(1, 16, 16, 2, 2, 8), p, seed, offset),
                                            zeros(Float32, 8, 2, 16, 1), q, k, v)
        @test fwd(1234, 0) == fwd(1234, 0)
        @test fwd(1234, 0) != fwd(1234, 1)
        @test fwd(1234, 0) != fwd(99, 0)
        @test maxerr(fwd(1234, 0, 0.0), reference(q, k, v, zeros(Float32, 8, 2, 16, 1)).o) < 2e-5
    end

    @testset "KV cache: append one token and attend" begin
        b, capacity, hq, hkv, d = 2, 16, 4, 2, 8
        plan = set_causal!(Plan(b, 1, capacity, hq, hkv, d), FA.FLASHATTN_ALIGN_BOTTOM_RIGHT)
        set_kvcache!(plan, b; seqlen_new=1)
        k_cache, v_cache = data((d, hkv, capacity, b), 5), data((d, hkv, capacity, b), 6)
        q, k_new, v_new = data((d, hq, 1, b), 7), data((d, hkv, 1, b), 8), data((d, hkv, 1, b), 9)
        lens = Int32[5, 0]
        out = zeros(Float32, d, hq, 1, b)
        forward_kvcache!(plan, out, q, k_cache, v_cache, lens; k_new=k_new, v_new=v_new)
        for bi in 1:b
            n = lens[bi] + 1
            @test k_cache[:, :, n, bi] == k_new[:, :, 1, bi]
            @test v_cache[:, :, n, bi] == v_new[:, :, 1, bi]
            kk, vv = k_cache[:, :, 1:n, bi:bi], v_cache[:, :, 1:n, bi:bi]
            r = reference(q[:, :, :, bi:bi], kk, vv, zeros(Float32, d, hq, 1, 1))
            @test maxerr(out[:, :, :, bi:bi], r.o) < 2e-5
        end
        @test is_error(caught(() -> forward_kvcache!(Plan(b, 1, capacity, hq, hkv, d), out, q, k_cache, v_cache,
                                                     lens)),
                       FA.FLASHATTN_STATUS_PLAN_INCOMPLETE, :FlashAttn, "set_kvcache!")
    end

    @testset "combine partial results" begin
        o_partial = data((4, 2, 3, 1, 2), 3)
        lse_partial = data((3, 2, 1, 2), 4)
        lse_partial[2, 1, 1, :] .= -Inf32  # a row no part saw
        o, lse = fill(7.0f0, 4, 2, 3, 1), zeros(Float32, 3, 2, 1)
        combine!(o, o_partial, lse_partial; lse=lse)
        for i in 1:3, h in 1:2
            l = Float64.(lse_partial[i, h, 1, :])
            if all(l .== -Inf)
                @test lse[i, h, 1] == -Inf32
                @test all(o[:, h, i, 1] .== 0)
                continue
            end
            total = log(sum(exp.(l)))
            @test abs(lse[i, h, 1] - total) < 1e-5
            want = sum(exp(l[s] - total) .* Float64.(o_partial[:, h, i, 1, s]) for s in 1:2)
            @test maxerr(o[:, h, i, 1], want) < 1e-5
        end
    end

    @testset "errors carry the status, its name, the message and the function" begin
        e = caught(() -> Plan(1, 8, 8, 2, 2, 300))
        @test is_error(e, FA.FLASHATTN_STATUS_INVALID_SHAPE, :flashattn_plan_set_shape, "head_dim_qk")
        @test e.status == 102 && e.name == "FLASHATTN_STATUS_INVALID_SHAPE"
        @test occursin("head_dim_qk", sprint(showerror, e))
        @test is_error(caught(() -> Plan(1, 8, 8, 3, 2, 8)), FA.FLASHATTN_STATUS_INVALID_HEADS,
                       :flashattn_plan_set_shape)

        plan = Plan(1, 8, 8, 2, 2, 8)
        @test is_error(caught(() -> set_dropout!(plan, 1.5)), FA.FLASHATTN_STATUS_INVALID_VALUE,
                       :flashattn_plan_set_dropout)
        @test is_error(caught(() -> set_strides!(plan, FA.FLASHATTN_TENSOR_Q, (1, 2, 3, 4))),
                       FA.FLASHATTN_STATUS_INVALID_STRIDE, :flashattn_plan_set_strides)
        @test is_error(caught(() -> set_strides!(plan, FA.FLASHATTN_TENSOR_Q, (1, 2, 3))),
                       FA.FLASHATTN_STATUS_INVALID_ARGUMENT, :FlashAttn, "4 entries")

        # The binding's checks before the call: size, element type; nothing is written.
        x = zeros(Float32, 8, 2, 8, 1)
        out = fill(5.0f0, 8, 2, 7, 1)
        @test is_error(caught(() -> forward!(plan, out, x, x, x)), FA.FLASHATTN_STATUS_INVALID_SHAPE, :FlashAttn,
                       "out")
        @test all(out .== 5)
        xh, outh = zeros(Float16, 8, 2, 8, 1), fill(Float16(5), 8, 2, 8, 1)
        @test is_error(caught(() -> forward!(plan, outh, xh, xh, xh)), FA.FLASHATTN_STATUS_INVALID_ARGUMENT,
                       :FlashAttn, "element type")
        @test all(outh .== 5)
        xd = zeros(Float64, 8, 2, 8, 1)
        @test is_error(caught(() -> forward!(plan, xd, xd, xd, xd)), FA.FLASHATTN_STATUS_DTYPE_NOT_SUPPORTED,
                       :FlashAttn, "Float64")

        # The library's check at run time: non-monotonic offsets.
        vl = set_varlen!(Plan(2, 4, 4, 1, 1, 4), (6, 6))
        xv, ov = fill(0.5f0, 4, 1, 6), fill(9.0f0, 4, 1, 6)
        bad = Int32[0, 5, 3]
        @test is_error(caught(() -> forward!(vl, ov, xv, xv, xv; cu_seqlens_q=bad, cu_seqlens_k=bad)),
                       FA.FLASHATTN_STATUS_INVALID_SEQLENS, :flashattn_fwd, "cu_seqlens")
        @test all(ov .== 9)

        # A destroyed plan (destroy! is idempotent).
        destroy!(plan)
        destroy!(plan)
        @test is_error(caught(() -> set_scale!(plan, 1.0)), FA.FLASHATTN_STATUS_NULL_POINTER, :FlashAttn,
                       "destroyed")
    end
end
