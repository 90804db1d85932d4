"""flashattn.hf: libflashattn registered as a Transformers attention implementation,
against Transformers' SDPA on a tiny Llama with GQA (training losses, padded batches,
cached generation). Skipped where torch or transformers does not import."""
import copy
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: the Transformers tests need it")
pytest.importorskip("transformers", reason="transformers is not importable: the Transformers tests need it")

import flashattn  # noqa: E402
import flashattn.hf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import train_tiny_llama  # noqa: E402


@pytest.fixture
def spy(monkeypatch):
    """Records the keyword arguments of each flashattn.attention call made by the integration."""
    calls = []
    real = flashattn.hf.attention

    def record(q, k, v, **kw):
        calls.append(dict(kw, k_heads=k.shape[1]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(flashattn.hf, "attention", record)
    return calls


@pytest.mark.parametrize("padding", [False, True])
def test_tiny_llama_training_matches_sdpa(spy, padding):
    ref, got = train_tiny_llama.compare(steps=4, batch=3, seqlen=24, padding=padding)
    assert len(got) == 4 and spy, "the registered implementation was not called"
    assert all(c["k_heads"] == 2 for c in spy)  # GQA: k/v heads are not repeated
    assert all((c["key_padding_mask"] is not None) == padding for c in spy)
    for r, g in zip(ref, got):
        assert abs(g - r) <= 1e-3 * abs(r)


def test_left_padded_cached_generation_matches_sdpa(spy):
    model = train_tiny_llama.tiny_llama("sdpa").eval()
    fa_model = copy.deepcopy(model)
    fa_model.set_attn_implementation(flashattn.hf.register())
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(**kw)
        got = fa_model.generate(**kw)
    assert torch.equal(got, want)
    assert any(c["attn_mask"] is None and c["causal"] is False for c in spy)  # one-token decode steps


def test_register_refuses_names_transformers_reserves():
    with pytest.raises(flashattn.InvalidArgumentError, match="name='my_flash'"):
        flashattn.hf.register("my_flash")
    assert flashattn.hf.register() == "libfa"
