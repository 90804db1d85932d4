"""Training-step time of a Transformers model with SDPA and with libflashattn, in one process.

    python3 bindings/python/benchmarks/train_step.py --device cuda               # GPT-2 small
    python3 bindings/python/benchmarks/train_step.py --device cuda --model llama  # 0.5B, GQA
    python3 bindings/python/benchmarks/train_step.py --device cpu --tiny          # a smoke run

Both runs start from the same weights and see the same batches (bf16 autocast on CUDA,
AdamW). Each step is forward, backward and the optimizer step; the time per step is the
median over --steps steps after --warmup, synchronized at each step's end. The two
implementations alternate in rounds (--rounds) so that clock drift hits both alike.

Printed per implementation: ms per step, tokens per second, the last loss; then the
throughput ratio libfa / sdpa, the attention calls per step (forward and backward) and
which eager path libfa's calls took (the compiled op of flashattn.torch_ext, or the
Python path and why).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flashattn.hf  # noqa: E402
import flashattn._torch_plans  # noqa: E402
import flashattn.torch_ext  # noqa: E402


def build(model, tiny, attn, attn_dropout):
    """The model (on the CPU, fp32) with attention implementation `attn` (and attention
    dropout `attn_dropout` where not None)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    if model == "gpt2":
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256) if tiny else GPT2Config()
        if attn_dropout is not None:
            cfg.attn_pdrop = attn_dropout
        cfg._attn_implementation = attn
        return GPT2LMHeadModel(cfg)
    if tiny:
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    else:  # about 0.5B parameters, 14 query / 2 KV heads of 64 (a Qwen2-0.5B-like shape)
        cfg = LlamaConfig(vocab_size=32000, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096)
    if attn_dropout is not None:
        cfg.attention_dropout = attn_dropout
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg)


def step_times(model, batches, device, bf16, steps, warmup):
    """Seconds of each timed training step and the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times, loss = [], None
    for i in range(warmup + steps):
        ids = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times, loss.item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    ap.add_argument("--tiny", action="store_true", help="a two-layer model of width 64 (smoke run)")
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default 8 on CUDA, 2 on the CPU)")
    ap.add_argument("--seqlen", type=int, default=None, help="tokens per sequence (default 1024, --tiny 128)")
    ap.add_argument("--attn-dropout", type=float, default=None,
                    help="attention dropout probability (default: the model's, 0.1 for GPT-2, 0 for Llama)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds, at least 1 (default 2)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be at least 1, not %d" % a.rounds)
    dev = torch.device(a.device)
    bf16 = dev.type == "cuda"
    batch = a.batch or (8 if dev.type == "cuda" else 2)
    seqlen = a.seqlen or (128 if a.tiny else 1024)
    libfa = flashattn.hf.register()

    torch.manual_seed(0)
    base = build(a.model, a.tiny, "sdpa", a.attn_dropout)
    vocab = base.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, vocab, (batch, seqlen), generator=gen).to(dev) for _ in range(4)]
    models = {}
    for name in ("sdpa", libfa):
        m = build(a.model, a.tiny, name, a.attn_dropout)
        m.load_state_dict(base.state_dict())
        models[name] = m.to(dev).train()
    del base

    calls = {"n": 0}
    inner = flashattn.hf.attention_forward

    def counted(*args, **kwargs):
        calls["n"] += 1
        return inner(*args, **kwargs)

    from transformers import AttentionInterface
    AttentionInterface.register(libfa, counted)
    times = {name: [] for name in models}
    losses = {}
    for _ in range(a.rounds):
        for name, m in models.items():
            calls["n"] = 0
            t, losses[name] = step_times(m, batches, dev, bf16, a.steps, a.warmup)
            times[name] += t
            if name == libfa:
                per_step = calls["n"] // (a.steps + a.warmup)
    params = sum(p.numel() for p in models["sdpa"].parameters())
    cfg = models["sdpa"].config
    drop = cfg.attn_pdrop if a.model == "gpt2" else cfg.attention_dropout
    print("device %s, model %s (%.0fM parameters), batch %d x %d tokens, attention dropout %g, %s, torch %s" % (
        torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", a.model, params / 1e6, batch, seqlen, drop,
        "bf16 autocast" if bf16 else "fp32", torch.__version__))
    med = {}
    for name, t in times.items():
        med[name] = statistics.median(t)
        print("%-6s %9.2f ms/step %12.0f tokens/s  last loss %.4f" % (name, med[name] * 1e3,
                                                                     batch * seqlen / med[name], losses[name]))
    print("throughput libfa / sdpa: %.3fx; %d attention forward calls per step, each with its backward" % (
        med["sdpa"] / med[libfa], per_step))
    ext = flashattn.torch_ext.status()
    op_plans = sys.modules[flashattn.torch_ext._module_name()].cache_size() if ext["active"] else 0
    print("libfa's calls: %d plans in the compiled op's cache, %d in the Python path's (compiled op: %s)" % (
        op_plans, flashattn._torch_plans.cache_size(), ext["reason"]))


if __name__ == "__main__":
    main()
