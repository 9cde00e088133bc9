#!/usr/bin/env python3
"""Writes testsuite/e2e/data/torch_ckpt/: a small PyTorch model exported for
training with its parameter names kept, and PyTorch's AdamW trajectory on
four batches, for test_torch_ckpt.py (which reads them with numpy only).
Needs torch.

    model.onnx   torch.onnx.export(Net(), ..., training=TrainingMode.TRAINING,
                 do_constant_folding=False): Linear, LayerNorm, ReLU,
                 BatchNorm1d (training mode), Linear, cross-entropy loss;
                 batch 6
    ref.npz      x, y: the four batches ([24, 8] and [24]); for k in 3, 4:
                 k.model.NAME (the state_dict after k steps, buffers
                 included) and k.exp_avg.NAME, k.exp_avg_sq.NAME, k.step
                 (AdamW's state by parameter name)

AdamW(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05), one group
(novac --no-decay=none).  Deterministic: fixed seeds.
"""
import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_ckpt")
B, LR, WD = 6, 0.01, 0.05


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16, bias=False)  # (a bias before BatchNorm gets no gradient)
        self.norm = nn.LayerNorm(16)
        self.bn = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x, y):
        h = self.norm(torch.relu(self.bn(self.fc1(x))))
        return nn.functional.cross_entropy(self.head(h), y)


def net():
    torch.manual_seed(7)
    return Net()


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4 * B, 8)).astype(np.float32)
    y = rng.integers(0, 4, 4 * B).astype(np.int64)
    m = net()
    m.train()
    torch.onnx.export(m, (torch.from_numpy(x[:B]), torch.from_numpy(y[:B])), os.path.join(OUT, "model.onnx"),
                      input_names=["x", "y"], output_names=["loss"], opset_version=17, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    # the export's trace ran a training forward, which moved the BatchNorm running statistics: the
    # initializers get a fresh model's values, the trajectory's start
    model = onnx.load(os.path.join(OUT, "model.onnx"))
    fresh = net().state_dict()
    for t in model.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(fresh[t.name].numpy(), t.name))
    onnx.save(model, os.path.join(OUT, "model.onnx"))
    m = net()
    m.train()
    opt = torch.optim.AdamW(m.parameters(), lr=LR, weight_decay=WD)
    ref = {"x": x, "y": y}
    names = {id(p): n for n, p in m.named_parameters()}
    for k in range(4):
        opt.zero_grad()
        loss = m(torch.from_numpy(x[k * B:(k + 1) * B]), torch.from_numpy(y[k * B:(k + 1) * B]))
        loss.backward()
        opt.step()
        if k + 1 in (3, 4):
            for n, t in m.state_dict().items():
                ref["%d.model.%s" % (k + 1, n)] = t.detach().numpy().copy()
            for p, st in opt.state.items():
                for key in ("exp_avg", "exp_avg_sq"):
                    ref["%d.%s.%s" % (k + 1, key, names[id(p)])] = st[key].numpy().copy()
                ref["%d.step" % (k + 1)] = np.float32(float(st["step"]))
    np.savez_compressed(os.path.join(OUT, "ref.npz"), **ref)


if __name__ == "__main__":
    main()
