"""Array adapters: DLPack (read from the DLTensor), __cuda_array_interface__ parsing and
device checks, without a GPU."""
import numpy as np
import pytest

import flashattn
from flashattn import Status, _arrays
import reference as ref

RNG = np.random.default_rng(3)


class DLPackOnly:
    """Exposes a numpy array only through the DLPack protocol."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class FakeCUDA:
    """Claims to be CUDA memory through __cuda_array_interface__ (v3)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7F0000000000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


needs_dlpack = pytest.mark.skipif(not hasattr(np.ndarray, "__dlpack__"), reason="numpy without DLPack")


@needs_dlpack
def test_dlpack_view_reads_the_dltensor():
    a = RNG.standard_normal((2, 5, 3, 8)).astype(np.float32)[:, ::2]  # strided seq dim
    v = _arrays.view("q", DLPackOnly(a))
    assert v.framework == "dlpack" and v.device == "cpu"
    assert v.shape == a.shape
    assert v.strides == tuple(s // 4 for s in a.strides)
    assert v.ptr == a.__array_interface__["data"][0]
    assert v.kind == _arrays.F32


@needs_dlpack
def test_forward_through_dlpack_inputs():
    q, k, v = (RNG.standard_normal((1, 9, 2, 8)).astype(np.float32) for _ in range(3))
    plan = flashattn.Plan(1, 9, 9, 2, 2, 8, dtype="fp32", backend="cpu")
    out, lse = plan.forward(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v))
    np.testing.assert_allclose(out, ref.attention(q, k, v)["o"], atol=2e-5)


def test_cuda_array_interface_parsing():
    x = FakeCUDA((2, 16, 4, 8))
    v = _arrays.view("q", x)
    assert v.is_cuda and v.shape == (2, 16, 4, 8) and v.strides == (512, 32, 8, 1) and v.kind == _arrays.F32
    y = FakeCUDA((2, 16, 4, 8), typestr="<f2", strides=(2048, 64, 16, 2))
    vy = _arrays.view("k", y)
    assert vy.kind == _arrays.F16 and vy.strides == (1024, 32, 8, 1)
    u = _arrays.view("v", FakeCUDA((4,), typestr="<u2"), want=_arrays.BF16)
    assert u.kind == _arrays.BF16
    with pytest.raises(flashattn.FlashAttnError) as ei:
        _arrays.view("v", FakeCUDA((4,), typestr="<f8"))
    assert ei.value.status == Status.DTYPE_NOT_SUPPORTED
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        _arrays.view("v", FakeCUDA((4,), strides=(6,)))
    assert ei.value.status == Status.INVALID_STRIDE


def test_device_memory_refused_by_a_cpu_plan_before_the_call():
    plan = flashattn.Plan(2, 16, 16, 4, 4, 8, dtype="fp32", backend="cpu")
    x = FakeCUDA((2, 16, 4, 8))
    with pytest.raises(flashattn.DeviceError) as ei:
        plan.forward(x, x, x, out=x, lse=FakeCUDA((2, 4, 16)))
    assert ei.value.status == Status.WRONG_MEMORY_SPACE and "q" in ei.value.message
    with pytest.raises(flashattn.FlashAttnError) as ei:
        flashattn.forward(x, np.zeros((2, 16, 4, 8), np.float32), np.zeros((2, 16, 4, 8), np.float32))
    assert ei.value.status == Status.WRONG_MEMORY_SPACE


def test_span_and_density_helpers():
    assert _arrays.span_elems((2, 3), (3, 1)) == 6
    assert _arrays.span_elems((2, 3), (10, 1)) == 13
    assert _arrays.span_elems((0, 3), (3, 1)) == 0
    assert _arrays.is_dense((2, 3, 4), (12, 4, 1))
    assert _arrays.is_dense((2, 3, 4), (4, 8, 1))
    assert not _arrays.is_dense((2, 3, 4), (24, 4, 1))
