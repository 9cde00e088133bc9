#!/usr/bin/env python3
"""Writes testsuite/e2e/data/amp_gpt_block/: the reference gradients of one
training step of a GPT block (examples/transformer_block.nova with its
params read from files) under PyTorch's CPU autocast, for test_amp.py.
Needs torch; the test reads the files with numpy only.

    model.nova   the block, params from file("NAME.bin")
    ref.npz      params (float32), tokens, targets, and for each precision P
                 in fp32, bf16, fp16: P.loss and P.grad.NAME, the loss and
                 gradients PyTorch computes (fp32: no autocast; bf16, fp16:
                 torch.autocast("cpu", dtype); fp16 with the loss scaled by
                 65536 and the gradients unscaled, as GradScaler does)

The PyTorch model is the one a PyTorch user writes: nn.Linear semantics for
x @ W + b (F.linear: the bias joins the low-precision matmul), the causal
mask added in the scores' dtype.  Deterministic: fixed seeds.
"""
import os
import re

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "amp_gpt_block")
EXAMPLE = os.path.join(ROOT, "..", "..", "..", "examples", "transformer_block.nova")
B = 4


def model_text():
    """The example with every normal(...) param read from NAME.bin instead."""
    text = open(EXAMPLE).read().replace("batch", str(B))
    return re.sub(r"^param (\w+): f32\[([^\]]*)\] = \S+$", r'param \1: f32[\2] = file("\1.bin")', text, flags=re.M)


def params(rng):
    shapes = dict(re.findall(r"^param (\w+): f32\[([^\]]*)\]", model_text(), re.M))
    P = {}
    for k, s in shapes.items():
        shape = tuple(int(x) for x in s.split(","))
        if k.endswith("_g"):
            P[k] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            P[k] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return P


def forward(P, tokens, targets, low):
    ln = lambda x, g, b: F.layer_norm(x, (32,), g, b, 1e-5)
    lin = lambda x, w, b=None: F.linear(x, w.t(), b)
    h = P["wte"][tokens] + P["wpe"]
    a = ln(h, P["ln1_g"], P["ln1_b"])
    qkv = lin(a, P["w_qkv"], P["b_qkv"])
    q = qkv[..., 0:32].reshape(B, 16, 4, 8).permute(0, 2, 1, 3)
    k = qkv[..., 32:64].reshape(B, 16, 4, 8).permute(0, 2, 3, 1)
    v = qkv[..., 64:96].reshape(B, 16, 4, 8).permute(0, 2, 1, 3)
    s = (q @ k) * 0.35355339059327373
    mask = torch.triu(torch.full((16, 16), -1e9), 1)
    att = torch.softmax((s + mask.to(s.dtype)).float(), -1)  # the softmax in f32, as the policy has it
    y = (att.to(v.dtype) @ v).permute(0, 2, 1, 3).reshape(B, 16, 32)
    h2 = h + lin(y, P["w_proj"], P["b_proj"])
    m = ln(h2, P["ln2_g"], P["ln2_b"])
    h3 = h2 + lin(F.gelu(lin(m, P["w_fc"], P["b_fc"])), P["w_out"], P["b_out"])
    logits = lin(ln(h3, P["lnf_g"], P["lnf_b"]), P["w_head"])
    return F.cross_entropy(logits.reshape(-1, 64).float(), targets.reshape(-1))


def step(P0, tokens, targets, precision):
    P = {k: torch.tensor(v, requires_grad=True) for k, v in P0.items()}
    tk, tg = torch.tensor(tokens), torch.tensor(targets)
    scale = 65536.0 if precision == "fp16" else 1.0
    if precision == "fp32":
        loss = forward(P, tk, tg, False)
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16 if precision == "bf16" else torch.float16):
            loss = forward(P, tk, tg, True)
    (loss * scale).backward()
    return float(loss.detach()), {k: (v.grad.double() / scale).float().numpy() for k, v in P.items()}


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(20261203)
    P = params(rng)
    tokens = rng.integers(0, 64, (B, 16)).astype(np.int64)
    targets = rng.integers(0, 64, (B, 16)).astype(np.int64)
    arrays = {"param." + k: v for k, v in P.items()}
    arrays["tokens"], arrays["targets"] = tokens, targets
    for prec in ("fp32", "bf16", "fp16"):
        loss, grads = step(P, tokens, targets, prec)
        arrays[prec + ".loss"] = np.float64(loss)
        arrays.update({"%s.grad.%s" % (prec, k): g for k, g in grads.items()})
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "model.nova"), "w") as f:
        f.write(model_text())
    np.savez_compressed(os.path.join(OUT, "ref.npz"), **arrays)


if __name__ == "__main__":
    main()
