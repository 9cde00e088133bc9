#!/usr/bin/env python3
"""Export the reference models of the ONNX test suite with PyTorch, and the
reference data to check novac against.

    python3 testsuite/onnx/models/export.py [--out DIR] [--no-verify]

For each model NAME (mlp, cnn, gpt_block) this writes, under DIR/NAME/
(DIR defaults to the directory of this script):

  model.onnx                       torch.onnx.export, TorchScript exporter
                                   (dynamo=False), opset 17, constant folding,
                                   batch dimension symbolic ("batch")
  test_data_set_0/input_K.pb       the inputs (batch = 4), ONNX TensorProto,
                                   named as the graph inputs
  test_data_set_0/output_0.pb      logits, computed by PyTorch (float32)
  test_data_set_0/output_1.pb      loss (scalar, mean cross entropy)
  test_data_set_0/grad.INIT.pb     d loss / d INIT for every trainable
                                   initializer INIT of model.onnx, in the
                                   initializer's layout (see reference.json:
                                   a parameter the exporter stored transposed
                                   has its gradient transposed too)
  test_data_set_0/sgd_step/param.INIT.pb
                                   INIT after one torch.optim.SGD(lr=0.1) step
                                   from the exported values
  test_data_set_0/adamw_losses.json
                                   the loss at each of 20 torch.optim.AdamW
                                   steps on the same batch (entry i is the loss
                                   computed before update i; starting again
                                   from the exported values)
  reference.json                   versions, command, inputs, outputs, and the
                                   mapping from torch parameter names to ONNX
                                   initializer names

Everything is float32 (labels int64) and deterministic: running the script
twice gives byte-identical .onnx and .pb files (with the same versions of
torch, onnx and numpy).

LayerNorm weights and biases are initialized away from their defaults (1 and
0): with identical values the exporter would merge them into one shared
initializer, which changes what training the ONNX file means.
"""
import argparse
import copy
import io
import json
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

OPSET = 17
BATCH = 4
SGD_LR = 0.1
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
ADAMW_STEPS = 20


# ---------------------------------------------------------------- models

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x, y):
        logits = self.fc2(F.relu(self.fc1(x)))
        return logits, F.cross_entropy(logits, y)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x, y):
        h = self.flatten(self.pool(F.relu(self.conv(x))))
        logits = self.fc(h)
        return logits, F.cross_entropy(logits, y)


VOCAB, D, T, HEADS = 50, 32, 8, 2


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)
        self.k = nn.Linear(D, D)
        self.v = nn.Linear(D, D)
        self.proj = nn.Linear(D, D)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)))

    def forward(self, x):
        B, L, C = x.size()
        hs = C // HEADS
        q = self.q(x).view(B, L, HEADS, hs).transpose(1, 2)      # B, nh, L, hs
        k = self.k(x).view(B, L, HEADS, hs).transpose(1, 2)
        v = self.v(x).view(B, L, HEADS, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)          # B, nh, L, L
        att = att.masked_fill(self.mask[:L, :L] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v                                              # B, nh, L, hs
        y = y.transpose(1, 2).contiguous().view(B, L, C)
        return self.proj(y)


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, D)
        self.pos_emb = nn.Embedding(T, D)
        self.ln1 = nn.LayerNorm(D)
        self.attn = CausalSelfAttention()
        self.ln2 = nn.LayerNorm(D)
        self.fc = nn.Linear(D, 4 * D)
        self.gelu = nn.GELU()
        self.fc_proj = nn.Linear(4 * D, D)
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB)
        with torch.no_grad():   # distinct values, see the module docstring
            for ln in (self.ln1, self.ln2, self.ln_f):
                ln.weight.add_(0.1 * torch.randn(D))
                ln.bias.add_(0.1 * torch.randn(D))

    def forward(self, idx, targets):
        B, L = idx.size()
        pos = torch.arange(0, L, dtype=torch.long, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        x = x + self.attn(self.ln1(x))
        x = x + self.fc_proj(self.gelu(self.fc(self.ln2(x))))
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss


def make_mlp(g):
    x = torch.randn(BATCH, 32, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return MLP(), ("x", "y"), (x, y)


def make_cnn(g):
    x = torch.randn(BATCH, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return CNN(), ("x", "y"), (x, y)


def make_gpt_block(g):
    idx = torch.randint(0, VOCAB, (BATCH, T), generator=g)
    targets = torch.randint(0, VOCAB, (BATCH, T), generator=g)
    return GPTBlock(), ("idx", "targets"), (idx, targets)


MODELS = [("mlp", make_mlp, 0), ("cnn", make_cnn, 1), ("gpt_block", make_gpt_block, 2)]


# ---------------------------------------------------------------- helpers

def write_pb(path, arr, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.array(arr, order="C", copy=True), name).SerializeToString())


def np32(t):
    return t.detach().cpu().numpy().astype(np.float32, copy=False)


def map_parameters(model, onnx_model):
    """torch parameter name -> (initializer name, layout) where layout is
    'same' or 'transposed'; every parameter must map to exactly one
    initializer and no two parameters to the same one."""
    inits = {i.name: numpy_helper.to_array(i) for i in onnx_model.graph.initializer}
    mapping, taken = {}, set()
    params = dict(model.named_parameters())
    for pname, p in params.items():             # kept under their own name
        if pname in inits:
            a = inits[pname]
            if a.shape != tuple(p.shape) or not np.array_equal(a, np32(p)):
                sys.exit("initializer %s differs from the parameter" % pname)
            mapping[pname] = (pname, "same")
            taken.add(pname)
    for pname, p in params.items():             # renamed, possibly transposed
        if pname in mapping:
            continue
        v = np32(p)
        hits = []
        for iname, a in inits.items():
            if iname in taken or a.dtype != np.float32:
                continue
            if a.shape == v.shape and np.array_equal(a, v):
                hits.append((iname, "same"))
            elif v.ndim == 2 and a.shape == v.T.shape and np.array_equal(a, v.T):
                hits.append((iname, "transposed"))
        if len(hits) != 1:
            sys.exit("parameter %s: %d matching initializers %s" % (pname, len(hits), hits))
        mapping[pname] = hits[0]
        taken.add(hits[0][0])
    others = {n: {"shape": list(a.shape), "dtype": str(a.dtype)}
              for n, a in inits.items() if n not in taken}
    return mapping, others


def in_layout(t, layout):
    a = np32(t)
    return np.ascontiguousarray(a.T) if layout == "transposed" else a


def verify(onnx_model, feeds, expect, tol=1e-4):
    """Run the exported model with onnx's reference evaluator and compare."""
    from onnx.reference import ReferenceEvaluator
    got = ReferenceEvaluator(onnx_model).run(None, feeds)
    for g, e in zip(got, expect):
        if g.shape != e.shape or not np.allclose(g, e, rtol=tol, atol=tol):
            return "max abs diff %g" % float(np.max(np.abs(g - e))) if g.shape == e.shape \
                else "shape %s vs %s" % (g.shape, e.shape)
    return None


# ---------------------------------------------------------------- export

def export_one(name, make, seed, outdir, command, check):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1000 + seed)
    model, input_names, inputs = make(g)
    model.eval()
    model.float()
    dynamic_axes = {n: {0: "batch"} for n in input_names}
    dynamic_axes["logits"] = {0: "batch"}

    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=OPSET,
                          input_names=list(input_names), output_names=["logits", "loss"],
                          dynamic_axes=dynamic_axes, do_constant_folding=True,
                          export_params=True, keep_initializers_as_inputs=False)
    data = buf.getvalue()
    onnx_model = onnx.load_from_string(data)
    onnx.checker.check_model(onnx_model, full_check=True)

    mdir = os.path.join(outdir, name)
    tdir = os.path.join(mdir, "test_data_set_0")
    sdir = os.path.join(tdir, "sgd_step")
    os.makedirs(sdir, exist_ok=True)
    for d in (tdir, sdir):                      # no stale files from other runs
        for f in os.listdir(d):
            if f.endswith(".pb"):
                os.remove(os.path.join(d, f))
    with open(os.path.join(mdir, "model.onnx"), "wb") as f:
        f.write(data)

    mapping, others = map_parameters(model, onnx_model)
    init0 = copy.deepcopy(model.state_dict())

    # forward + backward
    model.zero_grad()
    logits, loss = model(*inputs)
    loss.backward()
    for k, (n, t) in enumerate(zip(input_names, inputs)):
        write_pb(os.path.join(tdir, "input_%d.pb" % k), t.numpy(), n)
    outs = [np32(logits), np32(loss)]
    for k, (n, a) in enumerate(zip(("logits", "loss"), outs)):
        write_pb(os.path.join(tdir, "output_%d.pb" % k), a, n)
    params = dict(model.named_parameters())
    for pname, (iname, layout) in mapping.items():
        write_pb(os.path.join(tdir, "grad.%s.pb" % iname), in_layout(params[pname].grad, layout),
                 iname)

    # one SGD step
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    opt.step()
    for pname, (iname, layout) in mapping.items():
        write_pb(os.path.join(sdir, "param.%s.pb" % iname), in_layout(params[pname], layout),
                 iname)
    problems = []
    if check:
        feeds = {n: t.numpy() for n, t in zip(input_names, inputs)}
        err = verify(onnx_model, feeds, outs)
        if err:
            problems.append("exported model vs torch: " + err)
        stepped = copy.deepcopy(onnx_model)
        for init in stepped.graph.initializer:
            for pname, (iname, layout) in mapping.items():
                if init.name == iname:
                    init.CopyFrom(numpy_helper.from_array(in_layout(params[pname], layout), iname))
        with torch.no_grad():
            after = [np32(t) for t in model(*inputs)]
        err = verify(stepped, feeds, after)
        if err:
            problems.append("model with the sgd_step parameters vs torch: " + err)

    # AdamW from the exported values
    model.load_state_dict(init0)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad()
        _, l = model(*inputs)
        losses.append(float(l.item()))
        l.backward()
        opt.step()
    with open(os.path.join(tdir, "adamw_losses.json"), "w") as f:
        json.dump({"optimizer": "torch.optim.AdamW",
                   "lr": ADAMW["lr"], "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"],
                   "weight_decay": ADAMW["weight_decay"], "steps": ADAMW_STEPS,
                   "note": "losses[i] is the loss before update i, same batch every step",
                   "losses": losses}, f, indent=1)
        f.write("\n")

    ref = {
        "model": name,
        "torch": torch.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
        "command": command,
        "exporter": "torch.onnx.export(dynamo=False, opset_version=%d, do_constant_folding=True, "
                    "dynamic_axes=%s)" % (OPSET, json.dumps(dynamic_axes)),
        "opset": OPSET,
        "inputs": [{"name": n, "file": "input_%d.pb" % k, "shape": list(t.shape),
                    "dtype": str(t.numpy().dtype)} for k, (n, t) in enumerate(zip(input_names,
                                                                                   inputs))],
        "outputs": [{"name": n, "file": "output_%d.pb" % k, "shape": list(a.shape),
                     "dtype": str(a.dtype)} for k, (n, a) in enumerate(zip(("logits", "loss"),
                                                                            outs))],
        "parameters": [{"torch": p, "initializer": i, "layout": lay,
                        "shape": list(params[p].shape),
                        "initializer_shape": list(params[p].shape if lay == "same"
                                                  else params[p].shape[::-1])}
                       for p, (i, lay) in mapping.items()],
        "other_initializers": others,
        "sgd": {"optimizer": "torch.optim.SGD", "lr": SGD_LR},
    }
    with open(os.path.join(mdir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return mapping, problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--no-verify", action="store_true",
                    help="skip running the exports with onnx.reference")
    ap.add_argument("models", nargs="*", help="subset of: " + " ".join(m[0] for m in MODELS))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    command = "python3 testsuite/onnx/models/export.py"
    bad = 0
    for name, make, seed in MODELS:
        if args.models and name not in args.models:
            continue
        mapping, problems = export_one(name, make, seed, args.out, command, not args.no_verify)
        print("%s:" % name)
        for p, (i, lay) in mapping.items():
            print("  %-22s -> %s%s" % (p, i, " (transposed)" if lay == "transposed" else ""))
        for p in problems:
            print("  PROBLEM: " + p)
            bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
