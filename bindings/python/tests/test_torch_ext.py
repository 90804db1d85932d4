"""The compiled eager path (flashattn.torch_ext): built here, then compared with the Python
path call for call. Results and gradients must be bitwise equal (the same C calls on the
same plans), unsupported options must take the Python path, bad inputs must raise what
the Python path raises, and torch.compile must keep the custom ops. CPU tensors, and
CUDA tensors where a CUDA device and a CUDA build are there."""
import concurrent.futures
import contextlib
import ctypes
import itertools
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the compiled-extension tests need it")
if shutil.which(os.environ.get("CXX", "c++")) is None:
    pytest.skip("no C++ compiler (c++ or $CXX): the compiled extension cannot be built", allow_module_level=True)
if not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    pytest.skip("Python's development headers (Python.h) are not installed: the compiled extension cannot be built",
                allow_module_level=True)
import torch.utils.cpp_extension  # noqa: E402

try:
    torch.utils.cpp_extension.verify_ninja_availability()
except RuntimeError:
    pytest.skip("ninja is not installed: torch.utils.cpp_extension cannot build the extension", allow_module_level=True)

import flashattn  # noqa: E402
from flashattn import _torch_ops, _torch_plans, torch_ext  # noqa: E402
from test_torch_native import _Block  # noqa: E402  (attention in a small model: causal, GQA, strided k and v)

# Build output that says a tool or a system file is missing, not that torch_op.cpp is wrong.
_MISSING_TOOL = ("Python.h: No such file", "command not found", "cannot find -l", "cc1plus: not found",
                 "No such file or directory: 'ninja'")


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    """The extension, built into a temporary folder (a build in the user's cache would send
    every later eager call of that environment through it); skipped, with the reason, when
    the build fails for a missing tool. The Python path again after the module's tests."""
    env = pytest.MonkeyPatch()
    env.setenv(torch_ext.ENV_DIR, str(tmp_path_factory.mktemp("torch_ext")))
    try:
        try:
            torch_ext.build()
        except (RuntimeError, OSError) as e:
            missing = [m for m in _MISSING_TOOL if m in str(e)]
            if missing:
                pytest.skip("the compiled extension cannot be built here (%s): %s" % (missing[0], str(e)[-500:]))
            raise
        assert torch_ext.status()["active"], torch_ext.status()
        yield sys.modules[torch_ext._module_name()]
    finally:
        torch_ext.disable()
        env.undo()


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available() and flashattn.has_cuda_backend() and flashattn.cuda_device_count() > 0:
        devs.append("cuda")
    return devs


def _randn(*shape, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype=dtype, device=device)


# (batch, seqlen_q, heads_q, head_dim, seqlen_k, heads_kv), options, how the inputs are laid out
_CASES = {
    "plain": ((2, 7, 4, 16, 9, 2), {}, None),
    "causal": ((2, 7, 4, 16, 9, 2), dict(causal=True), None),
    "causal_bottom_right": ((2, 7, 4, 16, 9, 2), dict(causal=True, align="bottom_right"), None),
    "window": ((1, 12, 2, 16, 12, 2), dict(window=(3, 1)), None),
    "window_bottom_right": ((1, 5, 2, 16, 12, 1), dict(window=(4, 0), align="bottom_right"), None),
    "scale_softcap": ((2, 7, 4, 16, 9, 2), dict(scale=0.3, softcap=5.0), None),
    "mqa": ((1, 6, 8, 32, 10, 1), dict(causal=True), None),
    "bhsd_strides": ((2, 7, 4, 16, 9, 2), {}, "bhsd"),
    "sliced_strides": ((2, 7, 4, 16, 9, 2), dict(causal=True), "sliced"),
    "head_dim_v": ((1, 5, 2, 16, 6, 2), {}, "dv32"),
    "algorithm_standard": ((2, 7, 4, 16, 9, 2), dict(causal=True, algorithm="standard"), None),
    # Its own shape: on CUDA every case runs deterministic (below), so "causal" is this case there.
    "deterministic": ((2, 6, 4, 16, 11, 2), dict(causal=True, deterministic=True), None),
    "seqlen_1": ((2, 1, 4, 16, 1, 2), {}, None),
    "seqlen_q_1": ((2, 1, 4, 16, 9, 2), dict(causal=True, align="bottom_right"), None),
    "seqlen_k_1": ((2, 7, 4, 16, 1, 2), {}, None),
    "size_1_dims_odd_strides": ((1, 7, 1, 16, 9, 1), dict(causal=True), "odd"),
    "expanded_gqa_kv": ((2, 7, 4, 16, 9, 1), dict(causal=True), "expand"),
    "dropout": ((2, 7, 4, 16, 9, 2), dict(causal=True, dropout_p=0.25, seed=5, offset=3), None),
    # The plan of "dropout" with another seed and offset: runs that share a plan set their own.
    "dropout_other_seed": ((2, 7, 4, 16, 9, 2), dict(causal=True, dropout_p=0.25, seed=2**62 + 9, offset=-1), None),
    "dropout_gqa_window": ((1, 12, 4, 16, 12, 2), dict(window=(3, 1), dropout_p=0.5, seed=1), "bhsd"),
}
_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _odd_strides(t):
    """t's values with odd strides, unlike a dense tensor's, on its size-1 dims."""
    st = [s if n > 1 else 7 + 2 * i for i, (n, s) in enumerate(zip(t.shape, t.stride()))]
    return t.contiguous().as_strided(t.shape, st)


def _inputs(case, dtype, device):
    (b, sq, hq, d, sk, hk), opts, layout = _CASES[case]
    dv = 32 if layout == "dv32" else d
    q, k, v = _randn(b, sq, hq, d, seed=1), _randn(b, sk, hk, d, seed=2), _randn(b, sk, hk, dv, seed=3)
    q, k, v, do = (t.to(device=device, dtype=dtype) for t in (q, k, v, _randn(b, sq, hq, dv, seed=4)))
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    if layout == "sliced":
        q, k, v = (torch.cat([t, t], -1)[..., :t.shape[-1]] for t in (q, k, v))
    if layout == "odd":
        q, k, v = (_odd_strides(t) for t in (q, k, v))
    if layout == "expand":  # GQA through stride-0 heads: k, v of one head expanded to q's
        k, v = (t.expand(b, sk, hq, t.shape[-1]) for t in (k, v))
    opts = dict(opts)
    if device == "cuda":
        opts["deterministic"] = True  # bitwise run-to-run dq on CUDA, as the comparison needs
    return (q, k, v), do, opts


def _run(q, k, v, do, opts, hooks=None):
    """out, its gradients and the no-grad out; leaves of q, k, v's strides (views of them),
    the autograd graph saved under the `hooks` context when given."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    with hooks if hooks is not None else contextlib.nullcontext():
        out = flashattn.attention(*leaves, **opts)
    grads = torch.autograd.grad(out, leaves, do)
    with torch.no_grad():
        plain = flashattn.attention(q, k, v, **opts)
    return out, grads, plain


def _both_paths(fn):
    """fn() on the Python path, then through the extension."""
    torch_ext.disable()
    try:
        a = fn()
    finally:
        torch_ext.load()
    return a, fn()


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", list(_DTYPES))
@pytest.mark.parametrize("case", list(_CASES))
def test_forward_and_gradients_are_bitwise_those_of_the_python_path(ext, case, dtype, device):
    (q, k, v), do, opts = _inputs(case, _DTYPES[dtype], device)
    ext.clear_cache()
    (out_p, grads_p, plain_p), (out_e, grads_e, plain_e) = _both_paths(lambda: _run(q, k, v, do, opts))
    assert type(out_e.grad_fn).__name__ == "CppFunction" and ext.cache_size() > 0  # the op ran
    for a, b in zip((out_p, plain_p) + grads_p, (out_e, plain_e) + grads_e):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", _devices())
def test_dropout_draws_the_python_paths_seed_from_torchs_generator(ext, device):
    """Without a seed both paths draw it from torch's default generator, once per call,
    so the same generator state gives the same masks and leaves the same state."""
    (q, k, v), do, opts = _inputs("causal", torch.float16, device)
    opts.update(dropout_p=0.1)

    def seeded():
        torch.manual_seed(1234)
        res = _run(q, k, v, do, opts)
        return res, torch.get_rng_state()

    ((out_p, grads_p, plain_p), state_p), ((out_e, grads_e, plain_e), state_e) = _both_paths(seeded)
    assert type(out_e.grad_fn).__name__ == "CppFunction"
    assert torch.equal(state_p, state_e)
    for a, b in zip((out_p, plain_p) + grads_p, (out_e, plain_e) + grads_e):
        assert torch.equal(a, b)
    assert not torch.equal(out_e, plain_e)  # two calls, two seeds: two masks


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_direct_op_calls_give_the_custom_ops_out_lse_and_gradients(ext, device, dropout_p):
    """flashattn_ext::fwd/bwd against the Python path's custom ops flashattn::fwd/bwd on the
    same (seed, offset): out, LSE and gradients bitwise equal."""
    (q, k, v), do, opts = _inputs("window", torch.bfloat16, device)
    det = device == "cuda"
    seed, offset = 77, 11
    rng = torch.tensor([seed, offset], dtype=torch.int64) if dropout_p else None
    band = (3, 1, False, 0.0, 0.0)  # window (3, 1), top-left, default scale, no softcap
    out_p, lse_p = torch.ops.flashattn.fwd(q, k, v, None, None, None, None, None, rng, 0, 0, *band, False, dropout_p,
                                           0, 0, det, 0)
    out_e, lse_e = torch.ops.flashattn_ext.fwd(q, k, v, None, None, None, None, None, 0, 0, *band, False, dropout_p,
                                               seed, offset, 0, 0, det, 0)
    assert torch.equal(out_p, out_e) and torch.equal(lse_p, lse_e)
    grads_p = torch.ops.flashattn.bwd(do, q, k, v, out_p, lse_p, None, None, None, None, None, rng, 0, 0, *band, False,
                                      dropout_p, 0, 0, det, 0, False)[:3]
    grads_e = torch.ops.flashattn_ext.bwd(do, q, k, v, out_e, lse_e, None, None, None, None, None, 0, 0, *band, False,
                                          dropout_p, seed, offset, 0, 0, det, 0, False)[:3]
    assert all(torch.equal(a, b) for a, b in zip(grads_p, grads_e))


def test_backward_takes_gradients_of_any_strides(ext):
    (q, k, v), do, opts = _inputs("causal", torch.float32, "cpu")
    do_t = do.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    (_, grads_p, _), (_, grads_e, _) = _both_paths(lambda: _run(q, k, v, do_t, opts))
    assert all(torch.equal(a, b) for a, b in zip(grads_p, grads_e))


def test_zero_stride_dout_of_a_sum_gives_the_python_paths_gradients(ext):
    (q, k, v), _, opts = _inputs("bhsd_strides", torch.float32, "cpu")

    def grads():
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        flashattn.attention(*leaves, **opts).sum().backward()  # dout: a scalar expanded, strides 0
        return [t.grad for t in leaves]

    python_path, extension = _both_paths(grads)
    assert all(torch.equal(a, b) for a, b in zip(python_path, extension))


@pytest.mark.parametrize("wanted", ["q", "k", "v", "kv", "qv"])
def test_only_some_inputs_requiring_grad_get_the_python_paths_gradients(ext, wanted):
    (q, k, v), do, opts = _inputs("causal", torch.float32, "cpu")

    def grads():
        leaves = [t.detach().requires_grad_(name in wanted) for name, t in zip("qkv", (q, k, v))]
        out = flashattn.attention(*leaves, **opts)
        out.backward(do)
        return type(out.grad_fn).__name__, [t.grad for t in leaves]

    (fn_p, python_path), (fn_e, extension) = _both_paths(grads)
    assert fn_e == "CppFunction" and fn_p == "_AttentionBackward"
    for name, a, b in zip("qkv", python_path, extension):
        assert (a is None and b is None) if name not in wanted else torch.equal(a, b), name


@pytest.mark.parametrize("case", ["bhsd_strides", "sliced_strides", "expanded_gqa_kv"])
def test_save_on_cpu_gives_the_gradients_of_plain_autograd(ext, case):
    """save_on_cpu(pin_memory=True) saves dense copies (on the CPU too): both paths must run
    the backward on a plan for the strides of those, not on the forward's."""
    (q, k, v), do, opts = _inputs(case, torch.float32, "cpu")
    _, want, _ = _run(q, k, v, do, opts)
    hooks = torch.autograd.graph.save_on_cpu(pin_memory=True)
    (_, python_path, _), (_, extension, _) = _both_paths(lambda: _run(q, k, v, do, opts, hooks))
    for a, b, w in zip(python_path, extension, want):
        assert torch.equal(a, b)
        assert torch.allclose(a, w, rtol=1e-5, atol=1e-6)


def test_an_error_in_the_backward_is_the_python_paths(ext):
    """Saved tensors that come back with a strided last dim (a saved-tensor hook) fail in
    the backward's plan: both paths raise the library's error through autograd."""
    (q, k, v), do, opts = _inputs("plain", torch.float32, "cpu")

    def strided(t):
        return t.transpose(1, 3).contiguous().transpose(1, 3) if t.dim() == 4 else t

    hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, strided)
    python_path, extension = _both_paths(lambda: _error_of(lambda: _run(q, k, v, do, opts, hooks)))
    assert python_path is not None and issubclass(python_path[0], flashattn.FlashAttnError)
    assert extension == python_path


# A stand-in for libflashattn with every symbol the op binds: it reports the version
# FAKE_VERSION, fails every plan_create with status FAKE_STATUS and a message that is not
# UTF-8; the other functions are never called (the op runs nothing without a plan).
_FAKE_LIBRARY = r"""
extern "C" {
int flashattn_get_version(int* major, int* minor, int* patch) {
  const int v[3] = {FAKE_VERSION};
  *major = v[0], *minor = v[1], *patch = v[2];
  return v[0] * 10000 + v[1] * 100 + v[2];
}
int flashattn_plan_create(void** plan, int, int) { *plan = nullptr; return FAKE_STATUS; }
const char* flashattn_last_error(void) { return "bad bytes \xff\xfe in a message"; }
const char* flashattn_status_string(int) { return "FAKE_STATUS_\xe9"; }
#define UNUSED(name) void name(void) {}
UNUSED(flashattn_plan_destroy) UNUSED(flashattn_plan_set_shape) UNUSED(flashattn_plan_set_dtype)
UNUSED(flashattn_plan_set_strides) UNUSED(flashattn_plan_set_band_mask) UNUSED(flashattn_plan_set_softmax_scale)
UNUSED(flashattn_plan_set_softcap) UNUSED(flashattn_plan_set_dropout) UNUSED(flashattn_plan_set_deterministic)
UNUSED(flashattn_plan_set_algorithm) UNUSED(flashattn_plan_get_workspace_size) UNUSED(flashattn_fwd)
UNUSED(flashattn_bwd) UNUSED(flashattn_plan_set_bias) UNUSED(flashattn_plan_set_alibi_batch_stride)
UNUSED(flashattn_plan_set_varlen) UNUSED(flashattn_plan_set_block_sparse)
}
"""


def _fake_library(folder, name, version, status):
    src = folder / (name + ".cpp")
    src.write_text(_FAKE_LIBRARY)
    out = folder / (name + ".so")
    subprocess.run([os.environ.get("CXX", "c++"), "-shared", "-fPIC", "-o", str(out), str(src),
                    "-DFAKE_VERSION=%d,%d,%d" % version, "-DFAKE_STATUS=%d" % status], check=True, timeout=120)
    return str(out)


def test_the_op_binds_once_and_refuses_to_run_before(ext, tmp_path):
    """In this process: a second init() for another library is refused. In a fresh one
    (reusing the module's build): calls before init() are refused, so is a library of
    another version (and the op stays unbound), and a bound library's non-UTF-8 message
    reaches the exception decoded with errors="replace", as flashattn._lib decodes it."""
    lib = flashattn.library_path()
    ext.init(lib)  # the library it is bound to: nothing happens
    version = flashattn.library_version()
    status = int(flashattn.Status.INVALID_SHAPE)
    older = _fake_library(tmp_path, "fake_old", (version[0] + 1, 0, 0), status)
    same = _fake_library(tmp_path, "fake_same", version, status)
    # Another library of the same version, loaded but not the one the op is bound to: the
    # stand-in (a second copy of libflashattn itself would run its static initializers in
    # this process, which the test has no business doing).
    ctypes.CDLL(same)
    with pytest.raises(RuntimeError, match="already bound to another libflashattn"):
        ext.init(same)
    probe = ("import ctypes, importlib.util, sys, torch\n"
             "spec = importlib.util.spec_from_file_location(%r, %r)\n"
             "m = importlib.util.module_from_spec(spec)\n"
             "spec.loader.exec_module(m)\n"
             "q = torch.zeros(1, 2, 1, 8)\n"
             "ctypes.CDLL(%r)  # loaded, as init() needs\n"
             "calls = (lambda: m.attention(q, q, q, None, None, None, None, None, None, 0, 0, -1, -1, False, 0.0,\n"
             "                             0.0, False, 0.0, 0, 0, False, 0),\n"
             "         lambda: torch.ops.flashattn_ext.fwd(q, q, q, None, None, None, None, None, 0, 0, -1, -1, False,\n"
             "                                             0.0, 0.0, False, 0.0, 0, 0, 0, 0, False, 0))\n"
             "for call in calls + (lambda: m.init(%r),) + calls:\n"
             "    try:\n"
             "        call()\n"
             "    except RuntimeError as e:\n"
             "        print('refused:', str(e).splitlines()[0])\n"
             "ctypes.CDLL(%r)\n"
             "m.init(%r)\n"
             "try:\n"
             "    calls[0]()\n"
             "except Exception as e:\n"
             "    print(type(e).__name__, ascii((e.message, e.status_name, e.function)))\n"
             % (torch_ext._module_name(), torch_ext.status()["path"], older, older, same, same))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
        flashattn.__file__)), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 6, res.stdout
    assert all("init() has not bound" in line for line in lines[:2] + lines[3:5]), res.stdout
    want = "is libflashattn %d.0.0 but this build of the op was compiled against flashattn.h %d.%d.%d" % (
        version[0] + 1, *version)
    assert want in lines[2], res.stdout
    message = b"bad bytes \xff\xfe in a message".decode(errors="replace")
    assert lines[5] == "InvalidArgumentError " + ascii((message, "FAKE_STATUS_\ufffd", "flashattn_plan_create"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("readelf") is None,
                    reason="the dynamic section is read with readelf, on Linux")
def test_the_op_links_the_cpp_runtime_of_the_process_and_formats_numbers(ext):
    """The module needs the shared libstdc++ the process runs rather than carrying a
    static copy, whose stream locale is never set up (where a host's compiler driver
    linked one, formatting a number into a refusal's message crashed the process)."""
    dynamic = subprocess.run(["readelf", "-d", torch_ext.status()["path"]], capture_output=True, text=True,
                             check=True).stdout
    needed = [line.rsplit("[", 1)[-1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert any(n.startswith("libstdc++.so") for n in needed), needed
    q = _randn(2, 5, 4, 16)
    with pytest.raises(RuntimeError, match=r"flashattn_ext: q, k, v must be 4-D .*\[5, 4, 16\]"):
        torch.ops.flashattn_ext.fwd(q[0], q, q, None, None, None, None, None, 0, 0, -1, -1, False, 0.0, 0.0, False,
                                    0.0, 0, 0, 0, 0, False, 0)


def test_threads_sharing_the_ops_cache_get_the_python_paths_results(ext):
    cases = ["plain", "causal", "window", "mqa", "bhsd_strides", "dropout", "dropout_other_seed"]

    def flat(case):
        (q, k, v), do, opts = _inputs(case, torch.float32, "cpu")
        out, grads, plain = _run(q, k, v, do, opts)
        return [out, plain, *grads]

    torch_ext.disable()
    want = {c: flat(c) for c in cases}
    torch_ext.load()
    ext.clear_cache()
    failures = []

    def worker(i):
        for j in range(12):
            c = cases[(i + j) % len(cases)]
            if not all(torch.equal(a, b) for a, b in zip(flat(c), want[c])):
                failures.append(c)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(worker, range(4)))
    assert not failures and ext.cache_size() == len(cases) - 1  # the two dropout cases share a plan


@pytest.mark.skipif("cuda" not in _devices(), reason="needs torch with CUDA, a GPU and a CUDA build of libflashattn")
def test_options_the_op_does_not_serve_take_the_python_path(ext):
    q, k, v = (_randn(2, 6, 2, 8, seed=s, device="cuda").requires_grad_(True) for s in (1, 2, 3))
    calls = {  # a layout in device memory: the plan wants its bytes on the host
        "block_sparse": lambda: flashattn.attention(q, k, v, block_sparse=(torch.ones(1, 1, dtype=torch.uint8,
                                                                                      device="cuda"), 8, 8)),
    }
    for name, call in calls.items():
        ext.clear_cache()
        _torch_plans.clear_cache()
        out = call()
        assert ext.cache_size() == 0 and _torch_plans.cache_size() == 1, name
        assert type(out.grad_fn).__name__ == "_AttentionBackward", name


def _error_of(call):
    try:
        call()
    except Exception as e:  # noqa: BLE001  (any exception type is compared)
        return type(e), str(e)
    return None


def test_bad_inputs_raise_what_the_python_path_raises(ext):
    q = _randn(1, 8, 2, 16)
    big = _randn(1, 2, 1, 300)
    bad = {
        "mixed dtypes": lambda: flashattn.attention(q, q.half(), q),
        "3-D q": lambda: flashattn.attention(q[0], q, q),
        "fp64": lambda: flashattn.attention(q.double(), q.double(), q.double()),
        "head dims differ": lambda: flashattn.attention(q, q[..., :8], q),
        "k and v disagree": lambda: flashattn.attention(q, q, q[:, :4]),
        "batch differs": lambda: flashattn.attention(q, torch.cat([q, q]), torch.cat([q, q])),
        "heads not divisible": lambda: flashattn.attention(_randn(1, 8, 3, 16), q, q),
        "head dim 300": lambda: flashattn.attention(big, big, big),
        "negative softcap": lambda: flashattn.attention(q, q, q, softcap=-1.0),
        "negative scale": lambda: flashattn.attention(q, q, q, scale=-2.0),
        "causal with right window": lambda: flashattn.attention(q, q, q, causal=True, window=(None, 2)),
        "bad algorithm": lambda: flashattn.attention(q, q, q, algorithm=7),
        "dropout 1": lambda: flashattn.attention(q, q, q, dropout_p=1.0, seed=1),
        "negative dropout": lambda: flashattn.attention(q, q, q, dropout_p=-0.1),
        "last dim strided": lambda: flashattn.attention(q.transpose(1, 3).contiguous().transpose(1, 3), q, q),
        "empty": lambda: flashattn.attention(q[:, :0], q, q),
    }
    ext.clear_cache()
    for name, call in bad.items():
        python_path, extension = _both_paths(lambda: _error_of(call))
        assert python_path is not None, name
        assert extension == python_path, name
    assert ext.cache_size() == 0  # no plan kept from a failed call


def _k_and_v_fit(q, k, v):
    """Whether k and v have the extents the plan takes from q's and k's."""
    return k.shape[0] == q.shape[0] and k.shape[3] == q.shape[3] and v.shape[:3] == k.shape[:3]


def test_direct_op_calls_refuse_inputs_of_mismatched_extents(ext):
    """torch.ops.flashattn_ext.* skip the Python checks: k and v whose extents do not
    match what the plan takes from q's and k's, and a bias or ALiBi slopes that do not fit
    q and k, are refused, naming the tensors."""
    q, k = _randn(2, 5, 4, 16), _randn(2, 6, 2, 16)
    bias, slopes = _randn(2, 4, 5, 6), torch.ones(2, 4)
    bad = {
        "3-D q": (q[0], k, k, None, None, "q, k, v must be 4-D"),
        "k batch": (q, k[:1], k[:1], None, None, "k .* q's batch"),
        "k head dim": (q, k[..., :8], k, None, None, "k .* q's batch and head dim"),
        "v heads": (q, k, k[:, :, :1], None, None, "v .* k's batch, length and heads"),
        "v length": (q, k, k[:, :3], None, None, "v .* k's batch, length and heads"),
        "v batch": (q, k, k[:1], None, None, "v .* k's batch, length and heads"),
        "bias 3-D": (q, k, k, bias[0], None, "bias .* must be 4-D"),
        "bias keys": (q, k, k, bias[..., :5], None, "bias .* size 1 where it broadcasts"),
        "bias heads": (q, k, k, bias[:, :2], None, "bias .* size 1 where it broadcasts"),
        "bias dtype": (q, k, k, bias.half(), None, "bias has dtype"),
        "bias and slopes": (q, k, k, bias, slopes, "bias and alibi_slopes cannot be combined"),
        "slopes heads": (q, k, k, None, slopes[:, :3], "alibi_slopes .* must be float32"),
        "slopes batch": (q, k, k, None, slopes[:1].expand(3, 4), "alibi_slopes .* must be float32"),
        "slopes strided heads": (q, k, k, None, torch.ones(8)[::2], "alibi_slopes .* contiguous heads"),
        "slopes fp16": (q, k, k, None, slopes.half(), "alibi_slopes .* must be float32"),
        "slopes 3-D": (q, k, k, None, slopes[None], "alibi_slopes .* must be float32"),
    }
    scalars = (None, None, None, 0, 0, -1, -1, False, 0.0, 0.0, False, 0.0, 0, 0, 0, 0, False, 0)  # no varlen
    n = ext.cache_size()
    for name, (a, b, c, bias_, slopes_, message) in bad.items():
        for op in (torch.ops.flashattn_ext.fwd, torch.ops.flashattn_ext.attention):
            with pytest.raises(RuntimeError, match="flashattn_ext: " + message):
                op(a, b, c, bias_, slopes_, *scalars)
        if a.dim() == 4 and _k_and_v_fit(a, b, c):  # the backward's checks of bias and slopes
            out, lse = torch.zeros(2, 5, 4, 16), torch.zeros(2, 4, 5)
            with pytest.raises(RuntimeError, match="flashattn_ext: " + message):
                torch.ops.flashattn_ext.bwd(out, a, b, c, out, lse, bias_, slopes_, *scalars, bias_ is not None)
    assert ext.cache_size() == n, "a refused call made a plan"


def test_a_direct_call_with_an_expanded_bias_gets_its_gradient(ext):
    """A bias that requires grad, expanded over heads and keys (stride 0): the direct op
    materializes it (as flashattn.attention does), so its gradient is that of the same bias
    materialized by the caller; the direct bwd refuses to write dbias through stride 0."""
    q, k, v = _randn(2, 7, 4, 16, seed=1), _randn(2, 9, 4, 16, seed=2), _randn(2, 9, 4, 16, seed=3)
    do = _randn(2, 7, 4, 16, seed=5)
    scalars = (None, None, None, 0, 0, -1, -1, False, 0.0, 0.0, False, 0.0, 0, 0, 0, 0, False, 0)
    grads = []
    for materialize in (False, True):
        base = _randn(2, 1, 7, 1, seed=4).requires_grad_()
        bias = base.expand(2, 4, 7, 9)
        out = torch.ops.flashattn_ext.attention(q, k, v, bias.clone() if materialize else bias, None, *scalars)
        out.backward(do)
        grads.append(base.grad)
    assert torch.equal(grads[0], grads[1])
    bias = _randn(2, 1, 7, 1, seed=4).expand(2, 4, 7, 9)
    out, lse = torch.ops.flashattn_ext.fwd(q, k, v, bias, None, *scalars)
    with pytest.raises(RuntimeError, match="want_dbias needs a bias without expanded dims"):
        torch.ops.flashattn_ext.bwd(do, q, k, v, out, lse, bias, None, *scalars, True)


# Bias, masks and ALiBi as flashattn.attention takes them, made for (batch, seqlen_q, heads_q,
# seqlen_k) = (2, 7, 4, 9); the bias tensors are leaves that require a gradient, or views
# of such leaves, unless named "no grad".
def _bias(*shape, seed=5):
    return _randn(*shape, seed=seed).requires_grad_(True)


_BIAS_CASES = {
    "bias_full": lambda: dict(bias=_bias(2, 4, 7, 9)),
    "bias_broadcast": lambda: dict(bias=_bias(1, 4, 1, 9), causal=True),
    "bias_3d_no_grad": lambda: dict(bias=_randn(4, 7, 9, seed=6)),
    "bias_expanded": lambda: dict(bias=_bias(2, 1, 7, 1).expand(2, 4, 7, 9)),
    "bias_keys_broadcast": lambda: dict(bias=_bias(2, 4, 7, 1), window=(3, 2)),
    "bias_permuted": lambda: dict(bias=_bias(2, 7, 4, 9).transpose(1, 2)),
    "bias_with_dropout": lambda: dict(bias=_bias(2, 4, 7, 9), dropout_p=0.3, seed=8),
    "bool_mask": lambda: dict(attn_mask=_randn(7, 9, seed=7) > -0.5),
    "float_mask_and_padding": lambda: dict(attn_mask=_bias(2, 1, 7, 9),
                                           key_padding_mask=torch.arange(9).expand(2, 9) < torch.tensor([[9], [5]])),
    "alibi_heads": lambda: dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625]), causal=True,
                                align="bottom_right"),
    "alibi_batch_heads": lambda: dict(alibi_slopes=_randn(2, 4, seed=9).abs()),
    "alibi_sliced_symmetric": lambda: dict(alibi_slopes=_randn(2, 8, seed=9).abs()[:, 2:6], alibi_symmetric=True,
                                           dropout_p=0.2, seed=3),
    "alibi_one_row": lambda: dict(alibi_slopes=_randn(1, 4, seed=9).abs().expand(2, 4), softcap=4.0),
}


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", list(_BIAS_CASES))
def test_bias_masks_and_alibi_are_bitwise_those_of_the_python_path(ext, case, dtype, device):
    (q, k, v), do, opts = _inputs("plain", _DTYPES[dtype], device)
    _assert_paths_agree(ext, q, k, v, do, opts, _BIAS_CASES[case](), device)


def _assert_paths_agree(ext, q, k, v, do, opts, extra, device):
    """flashattn.attention(q, k, v, **opts, **extra) on both paths: out, the no-grad out and
    the gradients of q, k, v and of the tensors of `extra` that require one (or of their
    bases) bitwise equal, and the op ran (tensors of `extra` go to `device` first)."""
    opts = dict(opts, **{n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in extra.items()})
    leaves = [t if t.is_leaf else t._base for t in extra.values() if isinstance(t, torch.Tensor) and t.requires_grad]

    def run():
        ext.clear_cache()
        for t in leaves:
            t.grad = None
        out, grads, plain = _run(q, k, v, do, opts)
        if leaves:
            torch.autograd.backward(flashattn.attention(q, k, v, **opts), do)
        return (out, plain) + grads + tuple(t.grad for t in leaves), ext.cache_size()

    (python_path, _), (extension, plans) = _both_paths(run)
    assert type(extension[0].grad_fn).__name__ == "CppFunction" and plans > 0  # the op ran
    assert all(g is not None for g in python_path)
    for a, b in zip(python_path, extension):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def test_bad_bias_masks_and_slopes_raise_what_the_python_path_raises(ext):
    q = _randn(2, 5, 4, 16)
    b = _randn(2, 4, 5, 5)
    bad = {
        "bias keys": dict(bias=b[..., :3]),
        "bias 5-D": dict(bias=b[None]),
        "bias int": dict(bias=torch.ones(2, 4, 5, 5, dtype=torch.int32)),
        "bias and slopes": dict(bias=b, alibi_slopes=torch.ones(4)),
        "mask int": dict(attn_mask=torch.ones(5, 5, dtype=torch.int64)),
        "padding 3-D": dict(key_padding_mask=torch.ones(2, 1, 5, dtype=torch.bool)),
        "slopes heads": dict(alibi_slopes=torch.ones(3)),
        "slopes fp64": dict(alibi_slopes=torch.ones(4, dtype=torch.float64)),
        "slopes strided": dict(alibi_slopes=torch.ones(8)[::2]),
        "slopes batch": dict(alibi_slopes=torch.ones(3, 4)),
        "slopes heads strided": dict(alibi_slopes=torch.ones(2, 8)[:, ::2]),
        "slopes 3-D": dict(alibi_slopes=torch.ones(1, 2, 4)),
        "bias bad softcap": dict(bias=b, softcap=-1.0),
    }
    ext.clear_cache()
    for name, kwargs in bad.items():
        python_path, extension = _both_paths(lambda: _error_of(lambda: flashattn.attention(q, q, q, **kwargs)))
        assert python_path is not None, name
        assert extension == python_path, name
    assert ext.cache_size() == 0


@pytest.mark.skipif("cuda" not in _devices(), reason="needs torch with CUDA, a GPU and a CUDA build of libflashattn")
@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_cuda_graph_capture_of_the_op_replays_new_inputs(ext, dropout_p):
    """Replays on new inputs give the eager results. With dropout, as on the Python path,
    the seed is drawn on the host at capture and replays keep it: the eager run of the
    same generator state is the reference."""
    def inputs(seed):
        return [_randn(2, 96, 8, 64, seed=seed + i, dtype=torch.bfloat16, device="cuda") for i in range(4)]

    (q, k, v, do), opts = inputs(0), dict(causal=True, align="bottom_right", deterministic=True, dropout_p=dropout_p)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: plan cache and allocator, outside the capture
        for _ in range(3):
            flashattn.attention(*leaves, **opts).backward(do)
    torch.cuda.current_stream().wait_stream(side)
    for t in leaves:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    torch.manual_seed(42)
    with torch.cuda.graph(graph):
        out = flashattn.attention(*leaves, **opts)
        out.backward(do)
    assert type(out.grad_fn).__name__ == "CppFunction"
    new = inputs(10)
    with torch.no_grad():
        for t, x in zip(leaves + [do], new):
            t.copy_(x)
    for _ in range(2):
        graph.replay()
    torch.cuda.synchronize()
    torch.manual_seed(42)
    want_out, want_grads, _ = _run(*new, opts)
    for got, ref in zip([out] + [t.grad for t in leaves], [want_out] + list(want_grads)):
        assert torch.equal(got, ref)


def test_compile_fullgraph_keeps_the_custom_ops_and_matches_the_eager_op(ext):
    torch.manual_seed(0)
    m = _Block()
    x = _randn(2, 13, 32, seed=9)
    ext.clear_cache()
    ref = m(x)
    ref.square().sum().backward()
    assert ext.cache_size() == 1  # eager: the compiled op
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    torch._dynamo.reset()
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    y = cm(x)
    y.square().sum().backward()
    assert torch.equal(y, ref)
    for p, w in zip(m.parameters(), want):
        assert torch.equal(p.grad, w)
    assert ext.cache_size() == 1  # compiled: the flashattn::fwd/bwd custom ops, not the extension


def test_status_says_which_path_eager_calls_take(ext, monkeypatch):
    s = torch_ext.status()
    assert s["active"] and s["path"].startswith(torch_ext.build_dir())
    assert _torch_ops._ext is not None
    torch_ext.disable()
    assert not torch_ext.status()["active"] and _torch_ops._ext is None
    monkeypatch.setenv(torch_ext.ENV_OFF, "0")
    torch_ext.load_at_first_call()
    assert not torch_ext.status()["active"] and "FLASHATTN_TORCH_EXT=0" in torch_ext.status()["reason"]
    monkeypatch.delenv(torch_ext.ENV_OFF)
    torch_ext.load_at_first_call()
    assert torch_ext.status()["active"] and _torch_ops._ext is not None


# Packed variable-length calls: sequences of these (query, key) lengths, empty ones among
# them; q (tokens, 4 heads, 16), k and v (tokens, heads_kv, 16).
_VARLEN_LENGTHS = ((3, 4), (0, 0), (7, 9), (5, 2), (0, 3), (1, 6))


def _varlen_inputs(dtype, device, heads_kv=2, layout=None, spare=0):
    """(q, k, v), dout and the varlen options; `spare` tokens past the last offsets, q, k, v
    heads-outer in memory with layout "heads_outer"."""
    lq, lk = zip(*_VARLEN_LENGTHS)
    tq, tk = sum(lq) + spare, sum(lk) + spare
    q, k, v = _randn(tq, 4, 16, seed=1), _randn(tk, heads_kv, 16, seed=2), _randn(tk, heads_kv, 16, seed=3)
    q, k, v, do = (t.to(device=device, dtype=dtype) for t in (q, k, v, _randn(tq, 4, 16, seed=4)))
    if layout == "heads_outer":
        q, k, v = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v))
    cu_q, cu_k = (torch.tensor((0,) + tuple(itertools.accumulate(n)), dtype=torch.int32, device=device)
                  for n in (lq, lk))
    opts = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lq), max_seqlen_k=max(lk))
    if device == "cuda":
        opts["deterministic"] = True
    return (q, k, v), do, opts


# Options (tensors made per call), and how the inputs are made.
_VARLEN_CASES = {
    "plain": (lambda: {}, {}),
    "causal": (lambda: dict(causal=True), {}),
    "causal_bottom_right": (lambda: dict(causal=True, align="bottom_right"), {}),
    "window_mqa": (lambda: dict(window=(2, 1), align="bottom_right"), dict(heads_kv=1)),
    "heads_outer_strides": (lambda: dict(causal=True, softcap=3.0), dict(layout="heads_outer")),
    "tokens_past_the_offsets": (lambda: dict(causal=True), dict(spare=3)),
    "max_lengths_given_larger": (lambda: dict(max_seqlen_q=11, max_seqlen_k=12), {}),
    "dropout_alibi_batch_heads": (lambda: dict(causal=True, dropout_p=0.3, seed=7, offset=2,
                                               alibi_slopes=_randn(6, 4, seed=9).abs()), {}),
    "alibi_heads_symmetric": (lambda: dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625]),
                                           alibi_symmetric=True), {}),
    "bias_broadcast": (lambda: dict(bias=_bias(1, 4, 7, 9), dropout_p=0.2, seed=1), {}),
}


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", list(_VARLEN_CASES))
def test_varlen_is_bitwise_that_of_the_python_path(ext, case, dtype, device):
    extra, how = _VARLEN_CASES[case]
    (q, k, v), do, opts = _varlen_inputs(_DTYPES[dtype], device, **how)
    _assert_paths_agree(ext, q, k, v, do, opts, extra(), device)


@pytest.mark.parametrize("device", _devices())
def test_varlen_plans_are_keyed_by_the_offsets_layout_not_their_values(ext, device):
    """Offsets are read by the library at each run: other values of the same layout run on
    the same plan (and give the Python path's results); other max lengths make a new one."""
    (q, k, v), do, opts = _varlen_inputs(torch.float32, device)
    ext.clear_cache()
    flashattn.attention(q, k, v, **opts)
    other = dict(opts, cu_seqlens_q=torch.tensor([0, 3, 3, 3, 10, 15, 16], dtype=torch.int32, device=device),
                 cu_seqlens_k=torch.tensor([0, 4, 13, 13, 13, 15, 24], dtype=torch.int32, device=device))
    python_path, extension = _both_paths(lambda: flashattn.attention(q, k, v, **other))
    assert torch.equal(python_path, extension) and ext.cache_size() == 1
    flashattn.attention(q, k, v, **dict(opts, max_seqlen_q=8))
    assert ext.cache_size() == 2


@pytest.mark.parametrize("device", _devices())
def test_direct_varlen_op_calls_give_the_custom_ops_out_lse_and_gradients(ext, device):
    (q, k, v), do, opts = _varlen_inputs(torch.bfloat16, device)
    cu_q, cu_k, max_q, max_k = opts["cu_seqlens_q"], opts["cu_seqlens_k"], opts["max_seqlen_q"], opts["max_seqlen_k"]
    det, seed, offset = device == "cuda", 5, 9
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    band = (-1, 0, True, 0.0, 0.0, False, 0.25)  # causal bottom-right, dropout 0.25
    out_p, lse_p = torch.ops.flashattn.fwd(q, k, v, None, None, cu_q, cu_k, None, rng, max_q, max_k, *band, 0, 0, det,
                                           0)
    out_e, lse_e = torch.ops.flashattn_ext.fwd(q, k, v, None, None, cu_q, cu_k, None, max_q, max_k, *band, seed,
                                               offset, 0, 0, det, 0)
    assert lse_e.shape == (4, q.shape[0]) and torch.equal(out_p, out_e) and torch.equal(lse_p, lse_e)
    grads_p = torch.ops.flashattn.bwd(do, q, k, v, out_p, lse_p, None, None, cu_q, cu_k, None, rng, max_q, max_k,
                                      *band, 0, 0, det, 0, False)[:3]
    grads_e = torch.ops.flashattn_ext.bwd(do, q, k, v, out_e, lse_e, None, None, cu_q, cu_k, None, max_q, max_k,
                                          *band, seed, offset, 0, 0, det, 0, False)[:3]
    assert all(torch.equal(a, b) for a, b in zip(grads_p, grads_e))


def test_fa2s_varlen_functions_take_the_op(ext):
    """flash_attn_varlen_func and the qkv-packed form (strided views of one buffer), with
    dropout drawn from torch's generator: the op runs, with the Python path's results."""
    from flashattn import flash_attn_interface as fa2
    (q, k, v), do, opts = _varlen_inputs(torch.float32, "cpu", heads_kv=4)
    cu, n = opts["cu_seqlens_k"], opts["max_seqlen_k"]
    qkv = torch.stack([k, k.flip(0), v], 1)
    calls = {
        "varlen": lambda t: fa2.flash_attn_varlen_func(t, k, v, opts["cu_seqlens_q"], cu, opts["max_seqlen_q"], n,
                                                       dropout_p=0.1, causal=True),
        "qkvpacked": lambda t: fa2.flash_attn_varlen_qkvpacked_func(t, cu, n, dropout_p=0.1, window_size=(3, 3)),
    }
    for name, call in calls.items():
        def grads(x=q if name == "varlen" else qkv):
            torch.manual_seed(3)
            leaf = x.detach().requires_grad_(True)
            out = call(leaf)
            out.backward(torch.ones_like(out))
            return type(out.grad_fn).__name__, out, leaf.grad

        (fn_p, out_p, grad_p), (fn_e, out_e, grad_e) = _both_paths(grads)
        assert fn_e == "CppFunction" and fn_p != fn_e, name
        assert torch.equal(out_p, out_e) and torch.equal(grad_p, grad_e), name


def _varlen_bad_inputs():
    """Inputs of 2 sequences of lengths 5 and 7 the plan would read out of bounds or with
    offsets that do not fit, with the op's refusal of each."""
    q, cu = _randn(12, 2, 16), torch.tensor([0, 5, 12], dtype=torch.int32)
    return {
        "4-D q": (dict(q=q[None]), "q, k, v must be 4-D .* with cu_seqlens"),
        "only cu_q": (dict(cu_seqlens_k=None), "variable-length mode needs both cu_seqlens_q and cu_seqlens_k"),
        "cu int64": (dict(cu_seqlens_q=cu.long()), "cu_seqlens_q must be int32 of shape \\(3\\)"),
        "cu_k shorter": (dict(cu_seqlens_k=cu[:2]), "cu_seqlens_k must be int32 of shape \\(3\\)"),
        "cu strided": (dict(cu_seqlens_k=torch.tensor([0, 9, 5, 9, 12], dtype=torch.int32)[::2]),
                       "cu_seqlens_k must be int32 .* contiguous"),
        "cu 2-D": (dict(cu_seqlens_q=cu[None]), "cu_seqlens_q .* must be \\(batch \\+ 1\\)"),
        "no sequence": (dict(cu_seqlens_q=cu[:1]), "cu_seqlens_q .* must be \\(batch \\+ 1\\)"),
        "k head dim": (dict(k=q[..., :8]), "k .* must have q's head dim"),
        "v tokens": (dict(v=q[:10]), "v .* must have k's length and heads"),
        "bias batch": (dict(bias=_randn(3, 2, 7, 7)), "bias .* size 1 where it broadcasts"),
        "slopes batch": (dict(alibi_slopes=torch.ones(3, 2)), "alibi_slopes .* must be float32"),
    }, dict(q=q, k=q, v=q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7, max_seqlen_k=7)


def test_bad_varlen_inputs_raise_what_the_python_path_raises(ext):
    """Offsets, shapes, bias and slopes the Python path refuses, and offset values the
    library refuses (decreasing, past the tokens, longer than the max lengths given)."""
    bad, good = _varlen_bad_inputs()
    calls = {name: dict(good, **changes) for name, (changes, _) in bad.items()}
    calls["decreasing"] = dict(good, cu_seqlens_q=torch.tensor([0, 7, 5], dtype=torch.int32))
    calls["past the tokens"] = dict(good, cu_seqlens_k=torch.tensor([0, 5, 13], dtype=torch.int32))
    calls["longer than max"] = dict(good, max_seqlen_q=6)
    ext.clear_cache()
    for name, kwargs in calls.items():
        args = [kwargs.pop(n) for n in "qkv"]
        python_path, extension = _both_paths(lambda: _error_of(lambda: flashattn.attention(*args, **kwargs)))
        assert python_path is not None and issubclass(python_path[0], flashattn.FlashAttnError), name
        assert extension == python_path, name


def test_direct_varlen_op_calls_refuse_what_would_be_read_out_of_bounds(ext):
    bad, good = _varlen_bad_inputs()
    scalars = (-1, -1, False, 0.0, 0.0, False, 0.0, 0, 0, 0, 0, False, 0)
    n = ext.cache_size()
    for name, (changes, message) in bad.items():
        a = dict(good, **changes)
        tensors = (a["q"], a["k"], a["v"], a.get("bias"), a.get("alibi_slopes"), a["cu_seqlens_q"], a["cu_seqlens_k"],
                   None, 7, 7)
        for op in (torch.ops.flashattn_ext.fwd, torch.ops.flashattn_ext.attention):
            with pytest.raises(RuntimeError, match="flashattn_ext: " + message):
                op(*tensors, *scalars)
        out = torch.zeros(12, 2, 16)
        with pytest.raises(RuntimeError, match="flashattn_ext: " + message):
            torch.ops.flashattn_ext.bwd(out, *tensors[:3], out, torch.zeros(2, 12), *tensors[3:], *scalars, False)
    assert ext.cache_size() == n, "a refused call made a plan"


def _layout(*shape, seed=11):
    """A uint8 block-sparse layout of this shape with about half its blocks on (one on per row)."""
    lay = (_randn(*shape, seed=seed) > 0).to(torch.uint8)
    lay[..., 0] = 1
    return lay


# Block-sparse layouts as flashattn.attention takes them (layout, block_q, block_k), for
# (batch, seqlen_q, heads_q, seqlen_k) = (2, 7, 4, 9), or with varlen for max lengths (7, 9).
_BLOCK_SPARSE_CASES = {
    "shared": lambda: dict(block_sparse=(_layout(2, 3), 4, 4), causal=True),
    "per_head_dropout": lambda: dict(block_sparse=(_layout(4, 3, 5), 3, 2), dropout_p=0.3, seed=4),
    "bool_with_bias": lambda: dict(block_sparse=(_layout(1, 2) > 0, 7, 5), bias=_bias(1, 4, 7, 9)),
    "one_block": lambda: dict(block_sparse=(torch.ones(1, 1, dtype=torch.uint8), 8, 16), window=(2, 2)),
}


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("case", list(_BLOCK_SPARSE_CASES))
def test_block_sparse_layouts_are_bitwise_those_of_the_python_path(ext, case, varlen, device):
    if varlen:
        (q, k, v), do, opts = _varlen_inputs(torch.bfloat16, device)
    else:
        (q, k, v), do, opts = _inputs("plain", torch.bfloat16, device)
    _assert_paths_agree(ext, q, k, v, do, opts, _BLOCK_SPARSE_CASES[case](), device)


def test_block_sparse_plans_are_keyed_by_the_layouts_values(ext):
    (q, k, v), _, _ = _inputs("plain", torch.float32, "cpu")
    ext.clear_cache()
    for lay in (_layout(2, 3), _layout(2, 3, seed=12), _layout(2, 3)):
        python_path, extension = _both_paths(lambda: flashattn.attention(q, k, v, block_sparse=(lay, 4, 4)))
        assert torch.equal(python_path, extension)
    assert ext.cache_size() == 2


def test_bad_block_sparse_layouts_raise_what_the_python_path_raises(ext):
    q = _randn(2, 7, 4, 16)
    bad = {
        "rows": (_layout(3, 3), 4, 4),
        "layout heads": (_layout(3, 2, 3), 4, 4),
        "block_q 0": (_layout(2, 3), 0, 4),
        "1-D": (torch.ones(3, dtype=torch.uint8), 4, 4),
        "4-D": (_layout(1, 4, 2, 3), 4, 4),
    }
    ext.clear_cache()
    for name, block_sparse in bad.items():
        python_path, extension = _both_paths(
            lambda: _error_of(lambda: flashattn.attention(q, q, q, block_sparse=block_sparse)))
        assert python_path is not None and issubclass(python_path[0], flashattn.FlashAttnError), name
        assert extension == python_path, name
    assert ext.cache_size() == 0


def test_direct_op_calls_refuse_layouts_of_other_dtypes_or_ranks(ext):
    q = _randn(2, 7, 4, 16)
    for lay in (_layout(2, 3).int(), torch.ones(3, dtype=torch.uint8), _layout(1, 4, 2, 3)):
        for op in (torch.ops.flashattn_ext.fwd, torch.ops.flashattn_ext.attention):
            with pytest.raises(RuntimeError, match="flashattn_ext: block_layout .* must be a host uint8 tensor"):
                op(q, q, q, None, None, None, None, lay, 0, 0, -1, -1, False, 0.0, 0.0, False, 0.0, 0, 0, 4, 4, False,
                   0)
