"""Errors: library statuses become FlashAttnError subclasses with .status, name and message;
the binding's own checks run before any call; nothing is written on failure."""
import numpy as np
import pytest

import flashattn
from flashattn import Status, _lib

RNG = np.random.default_rng(5)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def test_bad_head_dim_is_invalid_shape_naming_head_dim_qk():
    with pytest.raises(flashattn.FlashAttnError) as ei:
        flashattn.Plan(1, 8, 8, 2, 2, 300, backend="cpu")
    e = ei.value
    assert isinstance(e, flashattn.InvalidArgumentError) and isinstance(e, ValueError)
    assert e.status == 102 and e.status == Status.INVALID_SHAPE and e.status.name == "INVALID_SHAPE"
    assert e.status_name == "FLASHATTN_STATUS_INVALID_SHAPE"
    assert "head_dim_qk" in e.message and "300" in e.message
    assert e.function == "flashattn_plan_set_shape"
    assert "head_dim_qk" in str(e) and "102" in str(e)


@pytest.mark.parametrize("args,status,word", [
    ((1, 8, 8, 3, 2, 8), Status.INVALID_HEADS, "heads_q"),
    ((0, 8, 8, 2, 2, 8), Status.INVALID_SHAPE, "batch"),
    ((1, 8, 8, 2, 2, 8, 257), Status.INVALID_SHAPE, "head_dim_v"),
])
def test_shape_errors(args, status, word):
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        flashattn.Plan(*args, backend="cpu")
    assert ei.value.status == status
    assert word in ei.value.message


@pytest.mark.parametrize("setter,args,status,word", [
    ("set_dropout", (1.0,), Status.INVALID_VALUE, "p"),
    ("set_scale", (-1.0,), Status.INVALID_VALUE, "scale"),
    ("set_softcap", (float("nan"),), Status.INVALID_VALUE, "softcap"),
    ("set_strides", ("q", (1, 2, 3, 4)), Status.INVALID_STRIDE, "stride"),
    ("set_bias", ("alibi", (0, 0, 0, 1)), Status.INVALID_ARGUMENT, "strides"),
    ("set_block_sparse", (np.ones((3, 2, 2), np.uint8), 4, 4), Status.INVALID_LAYOUT, "layout_heads"),
    ("set_varlen", (-1, 4), Status.INVALID_SHAPE, "total_q"),
])
def test_setter_errors_leave_plan_usable(setter, args, status, word):
    plan = flashattn.Plan(1, 8, 8, 2, 2, 8, dtype="fp32", backend="cpu")
    with pytest.raises(flashattn.FlashAttnError) as ei:
        getattr(plan, setter)(*args)
    assert ei.value.status == status, ei.value
    assert word in ei.value.message
    q = rand(1, 8, 2, 8)
    out, _ = plan.forward(q, q, q)  # still a valid plan with its old options
    assert np.isfinite(out).all()


def test_library_side_enum_error():
    plan = flashattn.Plan(1, 8, 8, 2, 2, 8, backend="cpu")
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        _lib.call("flashattn_plan_set_band_mask", plan.handle, 5, 0, 0)
    assert ei.value.status == Status.INVALID_ENUM and "align" in ei.value.message


def test_python_side_enum_errors():
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        flashattn.Plan(1, 8, 8, 2, 2, 8, backend="gpu")
    assert ei.value.status == Status.INVALID_ENUM and "backend" in ei.value.message
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        flashattn.Plan(1, 8, 8, 2, 2, 8, backend="cpu", dtype="int8")
    assert ei.value.status == Status.INVALID_ENUM and "dtype" in ei.value.message


def test_cuda_backend_unavailable_without_cuda():
    if flashattn.has_cuda_backend() and flashattn.cuda_device_count() > 0:
        pytest.skip("a CUDA device is present")
    with pytest.raises(flashattn.FlashAttnError) as ei:
        flashattn.Plan(1, 8, 8, 2, 2, 8, backend="cuda")
    assert ei.value.status in (Status.BACKEND_UNAVAILABLE, Status.NO_DEVICE)
    assert isinstance(ei.value, (flashattn.NotSupportedError, flashattn.DeviceError))


def test_array_checks_before_the_call():
    plan = flashattn.Plan(2, 8, 8, 2, 2, 8, dtype="fp32", backend="cpu")
    q = rand(2, 8, 2, 8)
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(rand(2, 9, 2, 8), q, q)
    assert ei.value.status == Status.INVALID_SHAPE and "q" in ei.value.message and "(2, 9, 2, 8)" in ei.value.message
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q.astype(np.float16))
    assert "v" in ei.value.message and "fp16" in ei.value.message
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, stream=1234)
    assert ei.value.status == Status.INVALID_ARGUMENT and "stream" in ei.value.message
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, out=np.zeros((2, 8, 2, 8), np.float32)[::-1])
    assert ei.value.status == Status.INVALID_STRIDE
    ro = np.zeros((2, 8, 2, 8), np.float32)
    ro.flags.writeable = False
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, out=ro)
    assert "read-only" in ei.value.message
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, lse=np.zeros((2, 2, 9), np.float32))
    assert "lse" in ei.value.message
    with pytest.raises(flashattn.FlashAttnError) as ei:
        plan.forward(q, q, q, bias=rand(2, 2, 8, 8))
    assert "bias" in ei.value.message
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward([1, 2], q, q)
    assert "q" in ei.value.message


def test_workspace_too_small():
    plan = flashattn.Plan(1, 64, 64, 2, 2, 16, dtype="fp32", backend="cpu", algorithm="standard")
    need = plan.workspace_size("forward")
    if need == 0:
        pytest.skip("the CPU standard path needs no workspace")
    q = rand(1, 64, 2, 16)
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, workspace=np.empty(need - 1, np.uint8))
    assert ei.value.status == Status.WORKSPACE_TOO_SMALL


def test_library_run_error_writes_nothing():
    """Non-monotonic cu_seqlens are found by the library; the outputs keep their contents."""
    plan = flashattn.Plan(2, 8, 8, 2, 2, 8, dtype="fp32", backend="cpu").set_varlen(10, 10)
    q = rand(10, 2, 8)
    out = np.full((10, 2, 8), 7.0, np.float32)
    lse = np.full((2, 10), 7.0, np.float32)
    bad = np.array([0, 6, 4], dtype=np.int32)
    good = np.array([0, 4, 10], dtype=np.int32)
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, out=out, lse=lse, cu_seqlens_q=bad, cu_seqlens_k=good)
    assert ei.value.status == Status.INVALID_SEQLENS and "cu_seqlens_q" in ei.value.message
    assert ei.value.function == "flashattn_fwd"
    assert np.all(out == 7.0) and np.all(lse == 7.0)
    with pytest.raises(flashattn.InvalidArgumentError) as ei:
        plan.forward(q, q, q, cu_seqlens_q=good)
    assert ei.value.status == Status.NULL_POINTER and "cu_seqlens_k" in ei.value.message


def test_incompatible_options():
    q = rand(1, 8, 2, 8)
    with pytest.raises(flashattn.FlashAttnError) as ei:
        flashattn.forward(q, q, q, bias=rand(8, 8), alibi_slopes=np.ones(2, np.float32))
    assert ei.value.status == Status.INCOMPATIBLE_OPTIONS


def test_alibi_batch_stride_errors():
    plan = flashattn.Plan(2, 8, 8, 2, 2, 8, dtype="fp32", backend="cpu")
    with pytest.raises(flashattn.FlashAttnError) as ei:
        plan.set_alibi_batch_stride(2)  # no ALiBi yet
    assert ei.value.status == Status.INCOMPATIBLE_OPTIONS and "batch_stride" in ei.value.message
    plan.set_alibi()
    with pytest.raises(flashattn.FlashAttnError) as ei:
        plan.set_alibi_batch_stride(-1)
    assert ei.value.status == Status.INVALID_STRIDE and "batch_stride" in ei.value.message
    plan.set_alibi_batch_stride(2)
    q = rand(2, 8, 2, 8)
    for bad, status in ((np.ones(2, np.float32), Status.INVALID_SHAPE), (np.ones((2, 3), np.float32)[:, :2],
                                                                         Status.INVALID_STRIDE)):
        with pytest.raises(flashattn.FlashAttnError) as ei:
            plan.forward(q, q, q, alibi_slopes=bad)
        assert ei.value.status == status and "alibi_slopes" in ei.value.message
    out, _ = plan.forward(q, q, q, alibi_slopes=np.ones((2, 2), np.float32))
    assert np.isfinite(out).all()
    with pytest.raises(flashattn.FlashAttnError) as ei:
        flashattn.forward(q, q, q, alibi_slopes=np.ones((3, 2), np.float32))  # batch is 2
    assert ei.value.status == Status.INVALID_SHAPE and "alibi_slopes" in ei.value.message


def test_status_strings_and_error_classes():
    assert flashattn.status_string(102) == "FLASHATTN_STATUS_INVALID_SHAPE"
    assert flashattn.status_string(12345) == "FLASHATTN_STATUS_UNKNOWN"
    for s in Status:
        if s != Status.SUCCESS:
            assert flashattn.status_string(s) == "FLASHATTN_STATUS_" + s.name
    assert flashattn.error_class(203) is flashattn.NotSupportedError
    assert flashattn.error_class(300) is flashattn.ResourceError
    assert flashattn.error_class(401) is flashattn.DeviceError
    assert flashattn.error_class(900) is flashattn.InternalError
    e = flashattn.error_class(777)(777, "x")
    assert e.status == 777 and e.status_name == "FLASHATTN_STATUS_UNKNOWN"


def test_closed_plan():
    plan = flashattn.Plan(1, 8, 8, 2, 2, 8, backend="cpu")
    plan.close()
    plan.close()
    with pytest.raises(flashattn.FlashAttnError) as ei:
        plan.set_scale(1.0)
    assert ei.value.status == Status.NULL_POINTER
