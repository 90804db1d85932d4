#!/usr/bin/env python3
"""Proves check_against_header.py detects drift: the real files must pass, and each
deliberately broken copy (of the Julia wrapper or of the header) must fail with a problem
that names what was broken. Plain Python (no pytest needed); exit status 0 iff all pass."""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_against_header as chk  # noqa: E402

HEADER = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include", "flashattn.h")
JULIA = os.path.join(HERE, "src", "FlashAttn.jl")

# (description, file to break, old text, new text, word the problem list must contain)
JULIA_MUTATIONS = [
    ("ccall renamed", "jl", "@ccall libflashattn.flashattn_plan_set_softcap(",
     "@ccall libflashattn.flashattn_plan_set_softkap(", "flashattn_plan_set_softcap"),
    ("argument type narrowed", "jl", "seed::UInt64,", "seed::UInt32,", "flashattn_plan_set_dropout"),
    ("argument dropped", "jl", "block_q::Int64,\n                                                        block_k::Int64)",
     "block_q::Int64)", "flashattn_plan_set_block_sparse"),
    ("return type changed", "jl", "flashattn_cuda_device_count()::Cint", "flashattn_cuda_device_count()::Int64",
     "flashattn_cuda_device_count"),
    ("pointer level lost", "jl", "plan::Ptr{flashattn_plan_t}, backend", "plan::flashattn_plan_t, backend",
     "flashattn_plan_create"),
    ("float became double", "jl", "scale::Cfloat", "scale::Cdouble", "flashattn_plan_set_softmax_scale"),
    ("enum value changed", "jl", "FLASHATTN_STATUS_INVALID_SEQLENS = Cint(112)",
     "FLASHATTN_STATUS_INVALID_SEQLENS = Cint(113)", "FLASHATTN_STATUS_INVALID_SEQLENS"),
    ("enum constant missing", "jl", "const FLASHATTN_BIAS_ALIBI_SYMMETRIC = Cint(3)\n", "",
     "FLASHATTN_BIAS_ALIBI_SYMMETRIC"),
    ("define changed", "jl", "const FLASHATTN_MAX_HEAD_DIM = 256", "const FLASHATTN_MAX_HEAD_DIM = 128",
     "FLASHATTN_MAX_HEAD_DIM"),
    ("struct fields swapped", "jl", "    dq::Ptr{Cvoid}\n    dk::Ptr{Cvoid}\n", "    dk::Ptr{Cvoid}\n    dq::Ptr{Cvoid}\n",
     "flashattn_bwd_args_t"),
    ("struct field type", "jl", "    lse::Ptr{Cfloat}\n    bias::Ptr{Cvoid}\n    alibi_slopes",
     "    lse::Ptr{Cdouble}\n    bias::Ptr{Cvoid}\n    alibi_slopes", "flashattn_fwd_args_t field lse"),
    ("alias changed", "jl", "const flashattn_pass_t = Cint", "const flashattn_pass_t = Int64",
     "flashattn_plan_get_workspace_size"),
    ("wrong library", "jl", "@ccall libflashattn.flashattn_has_cuda_backend()", "@ccall libother.flashattn_has_cuda_backend()",
     "libother"),
]
HEADER_MUTATIONS = [
    ("header gains a function", "h", "FLASHATTN_API int flashattn_has_cuda_backend(void);",
     "FLASHATTN_API int flashattn_has_cuda_backend(void);\nFLASHATTN_API int flashattn_new_query(int x);",
     "flashattn_new_query"),
    ("header enum value changed", "h", "FLASHATTN_DTYPE_FP32 = 2", "FLASHATTN_DTYPE_FP32 = 3", "FLASHATTN_DTYPE_FP32"),
    ("header gains an enum value", "h", "FLASHATTN_PASS_FORWARD = 0,",
     "FLASHATTN_PASS_FORWARD = 0, FLASHATTN_PASS_BOTH = 5,", "FLASHATTN_PASS_BOTH"),
    ("header struct gains a field", "h", "  const int32_t* cu_seqlens_k;  /**< int32 [batch+1] token offsets. Required iff varlen. */\n} flashattn_fwd_args_t;",
     "  const int32_t* cu_seqlens_k;\n  const float* extra;\n} flashattn_fwd_args_t;", "flashattn_fwd_args_t"),
    ("header parameter type changed", "h", "flashattn_plan_set_deterministic(flashattn_plan_t plan, int enabled)",
     "flashattn_plan_set_deterministic(flashattn_plan_t plan, int64_t enabled)", "flashattn_plan_set_deterministic"),
    ("header parameter added", "h", "flashattn_plan_set_softcap(flashattn_plan_t plan, float softcap)",
     "flashattn_plan_set_softcap(flashattn_plan_t plan, float softcap, int mode)", "flashattn_plan_set_softcap"),
]


def run():
    with open(HEADER) as f:
        header = f.read()
    with open(JULIA) as f:
        julia = f.read()
    results = []

    problems = chk.compare(chk.parse_header(header), chk.parse_julia(julia))
    results.append(("real files pass", not problems, "\n".join(problems)))

    for desc, which, old, new, word in JULIA_MUTATIONS + HEADER_MUTATIONS:
        src = julia if which == "jl" else header
        if src.count(old) < 1:
            results.append((desc, False, "mutation anchor not found: %r" % old))
            continue
        broken = src.replace(old, new, 1)
        h = broken if which == "h" else header
        j = broken if which == "jl" else julia
        problems = chk.compare(chk.parse_header(h), chk.parse_julia(j))
        ok = bool(problems) and any(word in p for p in problems)
        results.append(("detects: " + desc, ok, "\n".join(problems) or "(no problem reported)"))

    # The command line fails (exit 1) on a broken copy and passes on the real files.
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "FlashAttn.jl")
        with open(bad, "w") as f:
            f.write(julia.replace("seed::UInt64,", "seed::Int64,", 1))
        script = os.path.join(HERE, "check_against_header.py")
        r_bad = subprocess.run([sys.executable, script, "--header", HEADER, "--julia", bad], capture_output=True,
                               text=True)
        r_ok = subprocess.run([sys.executable, script, "--header", HEADER, "--julia", JULIA], capture_output=True,
                              text=True)
        results.append(("CLI exit 1 on drift", r_bad.returncode == 1 and "FAIL" in r_bad.stdout, r_bad.stdout))
        results.append(("CLI exit 0 when in sync", r_ok.returncode == 0 and "OK" in r_ok.stdout, r_ok.stdout))

    failed = 0
    for desc, ok, detail in results:
        print("%s %s" % ("PASS" if ok else "FAIL", desc))
        if not ok:
            failed += 1
            print("    " + detail.replace("\n", "\n    "))
    print("%d passed, %d failed" % (len(results) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run())
