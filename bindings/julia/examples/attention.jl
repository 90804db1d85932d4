# Causal GQA attention, forward and backward, on the CPU backend.
#
#   FLASHATTN_LIBRARY=/path/to/libflashattn.so.0 julia --project=bindings/julia bindings/julia/examples/attention.jl
#
# NOTE: written without a Julia runtime; untested at runtime (see ../README.md).
using FlashAttn

println("libflashattn ", join(library_version(), "."), ", CUDA backend: ",
        FlashAttn.flashattn_has_cuda_backend() != 0)

# batch 2, 64 queries and keys, 8 query heads over 2 key/value heads, head dim 32.
b, sq, sk, hq, hkv, d = 2, 64, 64, 8, 2, 32
plan = Plan(b, sq, sk, hq, hkv, d; dtype=FlashAttn.FLASHATTN_DTYPE_FP32, backend=FlashAttn.FLASHATTN_BACKEND_CPU)
set_causal!(plan)
set_softcap!(plan, 30.0)

# Julia arrays are column-major: (dim, heads, seq, batch) is the library's BSHD layout.
q = randn(Float32, d, hq, sq, b)
k = randn(Float32, d, hkv, sk, b)
v = randn(Float32, d, hkv, sk, b)
out = similar(q)
lse = Array{Float32}(undef, sq, hq, b)
forward!(plan, out, q, k, v; lse=lse)

dout = ones(Float32, size(out))
dq, dk, dv = similar(q), similar(k), similar(v)
backward!(plan, dq, dk, dv, q, k, v, out, lse, dout)
println("sum(out) = ", sum(out), "  sum(dq) = ", sum(dq))

# Errors carry the status code, its name and the library's message.
try
    Plan(1, 8, 8, 2, 2, 300)
catch e
    e isa FlashAttnError || rethrow()
    println("expected: ", e.name, " (", e.status, "): ", e.message)
end
destroy!(plan)
