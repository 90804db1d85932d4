"""flashattn.combine (flashattn_combine) on the CPU backend: numpy arrays and torch tensors,
strided slices, -inf parts, every output dtype; every bad input is refused with a specific
status naming the argument, before anything is written."""
import numpy as np
import pytest

import flashattn
from flashattn import Status

RNG = np.random.default_rng(22)


def parts(n, b, s, h, d):
    o = RNG.standard_normal((n, b, s, h, d)).astype(np.float32)
    lse = (3 * RNG.standard_normal((n, b, h, s))).astype(np.float32)
    return o, lse


def merged(o, lse):
    """fp64 merge: lse = log sum exp lse_i, out = sum exp(lse_i - lse) o_i (-inf parts skipped)."""
    lse64 = lse.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.logaddexp.reduce(lse64, axis=0)
        w = np.where(np.isneginf(lse64), 0.0, np.exp(lse64 - m))
    w = np.nan_to_num(w)  # rows with every part -inf
    out = (o.astype(np.float64) * w.transpose(0, 1, 3, 2)[..., None]).sum(0)
    return out, m


@pytest.mark.parametrize("n,b,s,h,d", [(1, 1, 1, 1, 1), (2, 2, 37, 3, 24), (5, 1, 3, 2, 256)])
def test_numpy_matches_the_fp64_merge(n, b, s, h, d):
    o, lse = parts(n, b, s, h, d)
    out, lse_out = flashattn.combine(o, lse)
    ref, ref_lse = merged(o, lse)
    assert out.dtype == np.float32 and out.shape == (b, s, h, d) and lse_out.shape == (b, h, s)
    assert np.abs(out - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max())
    assert np.abs(lse_out - ref_lse).max() <= 2e-6 * max(1.0, np.abs(ref_lse).max())


def test_neg_inf_parts_are_skipped_and_empty_rows_get_zero_and_neg_inf():
    o, lse = parts(3, 1, 4, 2, 8)
    lse[1] = -np.inf              # part 1 covers no key of any row
    o[1] = np.nan                 # ... so its output is never read
    lse[:, 0, :, 2] = -np.inf     # row 2 has no part at all
    out, lse_out = flashattn.combine(o, lse)
    ref, ref_lse = merged(np.nan_to_num(o), lse)
    assert np.isfinite(out).all()
    assert (out[0, 2] == 0).all() and np.isneginf(lse_out[0, :, 2]).all()
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_given_outputs_with_strides_and_dtypes():
    o, lse = parts(2, 2, 9, 4, 16)
    big = np.full((2, 9, 8, 16), np.nan, np.float16)   # out = every other head of a larger buffer
    out = big[:, :, ::2]
    lse_out = np.empty((2, 4, 9), np.float32)
    got, got_lse = flashattn.combine(o, lse, out=out, lse=lse_out)
    assert got is out and got_lse is lse_out
    ref, ref_lse = merged(o, lse)
    assert np.abs(out.astype(np.float64) - ref).max() <= 2e-3 * np.abs(ref).max()
    assert np.isnan(big[:, :, 1::2]).all()              # the other heads are untouched
    assert np.abs(lse_out - ref_lse).max() <= 1e-5 * np.abs(ref_lse).max()
    only, none = flashattn.combine(o, lse, want_lse=False)
    assert none is None and np.abs(only - ref).max() <= 1e-5 * np.abs(ref).max()


def test_torch_slices_and_bf16_output():
    torch = pytest.importorskip("torch")
    o, lse = parts(3, 2, 10, 2, 8)
    ot, lt = torch.from_numpy(o), torch.from_numpy(lse)
    out, lse_out = flashattn.combine(ot[:, :, 3:7], lt[..., 3:7], dtype="bf16")
    ref, ref_lse = merged(o[:, :, 3:7], lse[..., 3:7])
    assert out.dtype == torch.bfloat16 and isinstance(lse_out, torch.Tensor)
    assert np.abs(out.double().numpy() - ref).max() <= 1e-2 * np.abs(ref).max()
    assert np.abs(lse_out.numpy() - ref_lse).max() <= 1e-5 * np.abs(ref_lse).max()


def _bad(status, word, o_partial, lse_partial, kw=None):
    with pytest.raises(flashattn.FlashAttnError) as ei:
        flashattn.combine(o_partial, lse_partial, **(kw or {}))
    assert ei.value.status == status, ei.value
    assert word in ei.value.message, ei.value.message


def test_bad_inputs_write_nothing():
    o, lse = parts(2, 1, 5, 2, 8)
    out = np.full((1, 5, 2, 8), np.nan, np.float32)
    lse_out = np.full((1, 2, 5), np.nan, np.float32)
    cases = [
        (Status.NULL_POINTER, "o_partial", None, lse, {}),
        (Status.DTYPE_NOT_SUPPORTED, "o_partial", o.astype(np.float16), lse, {}),
        (Status.DTYPE_NOT_SUPPORTED, "lse_partial", o, lse.astype(np.float16), {}),
        (Status.INVALID_SHAPE, "o_partial", o[0], lse, {}),
        (Status.INVALID_SHAPE, "lse_partial", o, lse[:, :, :, :4], {}),
        (Status.INVALID_SHAPE, "lse_partial", o, lse[:1], {}),
        (Status.INVALID_SHAPE, "out", o, lse, {"out": out[:, :4], "lse": lse_out}),
        (Status.INVALID_ARGUMENT, "dtype", o, lse, {"out": out, "lse": lse_out, "dtype": "fp16"}),
        (Status.INVALID_ENUM, "dtype", o, lse, {"dtype": "int8"}),
        (Status.INVALID_SHAPE, "lse", o, lse, {"out": out, "lse": lse_out[:, :1]}),
        (Status.DTYPE_NOT_SUPPORTED, "lse", o, lse, {"out": out, "lse": lse_out.astype(np.float16)}),
        (Status.INVALID_ARGUMENT, "stream", o, lse, {"out": out, "lse": lse_out, "stream": 1234}),
        (Status.INVALID_ARGUMENT, "read-only", o, lse, {"out": _readonly(out), "lse": lse_out}),
        # Checked by the library: dim stride, overlap, head_dim.
        (Status.INVALID_STRIDE, "o_strides", o, lse, {"out": np.full((1, 5, 2, 16), np.nan, np.float32)[..., ::2],
                                                      "lse": lse_out}),
        (Status.INVALID_ARGUMENT, "overlaps args.o_partial", o, lse, {"out": o[0], "lse": lse_out}),
        (Status.INVALID_SHAPE, "head_dim", *parts(1, 1, 1, 1, 257), {}),
    ]
    for status, word, oo, ll, kw in cases:
        _bad(status, word, oo, ll, kw)
        assert np.isnan(out).all() and np.isnan(lse_out).all(), (status, word)


def _readonly(a):
    a = a.view()
    a.flags.writeable = False
    return a


def test_torch_device_mismatch_is_wrong_memory_space():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to place one argument elsewhere")
    o, lse = parts(2, 1, 3, 1, 4)
    _bad(Status.WRONG_MEMORY_SPACE, "lse_partial", torch.from_numpy(o), torch.from_numpy(lse).cuda())
