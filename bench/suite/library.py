"""libflashattn through the flashattn Python package (bindings/python): which library is
loaded, and one dense BSHD problem on the GPU, checked once and then ready to time."""
import ctypes
import glob
import os
import sys

from .timing import short, time_cuda_rounds

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(explicit=None):
    """The in-tree flashattn package, bound to `explicit` if given, else to
    $FLASHATTN_LIBRARY, else to this checkout's most recently built build*/libflashattn.so.0
    or build/*/libflashattn.so.0, else to what the package finds on its own (the loader)."""
    if explicit:
        os.environ["FLASHATTN_LIBRARY"] = explicit
    elif not os.environ.get("FLASHATTN_LIBRARY"):
        built = glob.glob(os.path.join(REPO, "build*", "libflashattn.so.0")) + \
            glob.glob(os.path.join(REPO, "build", "*", "libflashattn.so.0"))
        if built:
            os.environ["FLASHATTN_LIBRARY"] = max(built, key=os.path.getmtime)
    sys.path.insert(0, os.path.join(REPO, "bindings", "python"))
    import flashattn
    flashattn.library_path()  # loads it now: a missing library fails here, not mid-run
    return flashattn


class LibCase:
    """Plan, outputs and workspace of one dense BSHD problem on the GPU.

    check_fwd()/check_bwd() run a pass through the package's Plan, which checks every
    argument (an error raises flashattn.FlashAttnError). fwd()/bwd() are the timed calls:
    the C functions through the package's own prototypes (flashattn._lib) with argument
    structs built once by prepare(), so the binding's per-call Python checks (tens of
    microseconds) are not timed, as PyTorch's timed calls are its C++ calls.
    """

    def __init__(self, fa, torch, algo, q, k, v, do, causal, dtype, need_bwd, opts=None):
        b, sq, h, d = q.shape
        sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
        self.fa, self.torch, self.need_bwd = fa, torch, need_bwd
        self.plan = fa.Plan(b, sq, sk, h, hkv, d, dv, dtype=dtype, backend="cuda", causal=causal, algorithm=algo,
                            **(opts or {}))
        self.q, self.k, self.v, self.do = q, k, v, do
        self.o = torch.empty(b, sq, h, dv, dtype=q.dtype, device=q.device)
        self.lse = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
        self.ws_fwd = self.plan.workspace_size("forward")
        self.ws_bwd = self.plan.workspace_size("backward") if need_bwd else 0
        self.ws = torch.empty(max(self.ws_fwd, self.ws_bwd, 1), dtype=torch.uint8, device=q.device)
        self.dq = self.dk = self.dv = None
        if need_bwd:
            self.dq, self.dk, self.dv = (torch.empty_like(x) for x in (q, k, v))
        self.prepare()

    def check_fwd(self):
        self.plan.forward(self.q, self.k, self.v, out=self.o, lse=self.lse, workspace=self.ws)

    def check_bwd(self):
        self.plan.backward(self.q, self.k, self.v, self.o, self.lse, self.do, dq=self.dq, dk=self.dk, dv=self.dv,
                           workspace=self.ws)

    def prepare(self):
        """(Re)build fwd() and bwd() from the tensors held now."""
        L = self.fa._lib

        def p(t):
            return None if t is None else t.data_ptr()
        self.fwd = self._call(L, "flashattn_fwd", L.FwdArgs(q=p(self.q), k=p(self.k), v=p(self.v), o=p(self.o),
                                                             lse=p(self.lse)))
        if self.need_bwd:
            self.bwd = self._call(L, "flashattn_bwd", L.BwdArgs(q=p(self.q), k=p(self.k), v=p(self.v), o=p(self.o),
                                                                 lse=p(self.lse), dout=p(self.do), dq=p(self.dq),
                                                                 dk=p(self.dk), dv=p(self.dv)))

    def _call(self, L, name, args):
        fn, handle, ref = getattr(L.lib(), name), self.plan.handle, ctypes.byref(args)
        ws, nbytes = self.ws.data_ptr(), self.ws.numel()
        stream = self.torch.cuda.current_stream().cuda_stream
        keep = args  # the struct must outlive the byref

        def call():
            L.check(fn(handle, ref, ws, nbytes, stream), name)
        call.args = keep
        return call


def lib_calls(fa, torch, algo, q, k, v, do, causal, dtype, directions, opts=None):
    """The library's passes in `directions` on one problem, each checked once through the
    package: (case, {direction: function}, errors); a refused backward is in errors["bwd"]
    while the forward stands. The case holds the buffers: keep it while timing."""
    c = LibCase(fa, torch, algo, q, k, v, do, causal, dtype, "bwd" in directions, opts)
    c.check_fwd()  # surface a library error before timing
    calls, errors = {}, {}
    if "fwd" in directions:
        calls["fwd"] = c.fwd
    if "bwd" in directions:
        try:
            c.check_bwd()
            calls["bwd"] = c.bwd
        except fa.FlashAttnError as e:
            errors["bwd"] = "library " + short(e)
    return c, calls, errors


def bench_lib(fa, torch, algo, q, k, v, do, causal, dtype, directions, opts=None):
    """Times the library's passes in `directions` on one problem (see lib_calls)."""
    c, calls, errors = lib_calls(fa, torch, algo, q, k, v, do, causal, dtype, directions, opts)
    res = time_cuda_rounds(torch, calls) if calls else {}
    res.update(ws_fwd=c.ws_fwd, ws_bwd=c.ws_bwd, errors=errors)
    return res


def std_fits(torch, b, h, sq, sk, bwd):
    """Whether the standard algorithm's O(N^2) workspace fits in free device memory."""
    per = b * h * sq * ((sk + 7) // 8 * 8) * 4
    need = per * (2 if bwd else 1)
    free, _ = torch.cuda.mem_get_info()
    return need < 0.8 * free, need
