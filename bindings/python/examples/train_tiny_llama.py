"""Train a tiny Llama (GQA) with Transformers' SDPA attention and with libflashattn
registered through flashattn.hf, from the same initial weights on the same batches,
and compare the losses step by step.

    python3 bindings/python/examples/train_tiny_llama.py                  # CPU, fp32
    python3 bindings/python/examples/train_tiny_llama.py --device cuda --bf16
    python3 bindings/python/examples/train_tiny_llama.py --padding        # padded batches

Prints one line per step and exits non-zero when a loss differs from SDPA's by more
than --rtol (relative).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashattn.hf  # noqa: E402


def tiny_llama(attn_implementation, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(cfg, attn_implementation=attn_implementation)


def batches(steps, batch, seqlen, padding, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ids = torch.randint(0, 128, (batch, seqlen), generator=g)
        mask = torch.ones(batch, seqlen, dtype=torch.long)
        if padding:  # right padding of random lengths, padded labels ignored
            lengths = torch.randint(seqlen // 2, seqlen + 1, (batch,), generator=g)
            mask = (torch.arange(seqlen)[None, :] < lengths[:, None]).long()
        labels = ids.masked_fill(mask == 0, -100)
        yield ids.to(device), mask.to(device), labels.to(device)


def train(model, data, device, bf16):
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for ids, mask, labels in data:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def compare(steps=8, batch=4, seqlen=48, padding=False, device="cpu", bf16=False):
    """(sdpa losses, flashattn losses) of the same training run."""
    device = torch.device(device)
    name = flashattn.hf.register()
    ref_model = tiny_llama("sdpa")
    fa_model = copy.deepcopy(ref_model)
    fa_model.set_attn_implementation(name)
    ref = train(ref_model, batches(steps, batch, seqlen, padding, device), device, bf16)
    got = train(fa_model, batches(steps, batch, seqlen, padding, device), device, bf16)
    return ref, got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (as in mixed-precision training)")
    ap.add_argument("--padding", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rtol", type=float, default=1e-3)
    a = ap.parse_args(argv)
    ref, got = compare(a.steps, padding=a.padding, device=a.device, bf16=a.bf16)
    worst = 0.0
    for i, (r, g) in enumerate(zip(ref, got)):
        rel = abs(g - r) / abs(r)
        worst = max(worst, rel)
        print("step %2d  sdpa %.6f  flashattn %.6f  rel %.1e" % (i, r, g, rel))
    print("max relative difference %.2e (tolerance %.0e)" % (worst, a.rtol))
    return 0 if worst <= a.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
