#!/usr/bin/env python3
"""Writes testsuite/e2e/data/seq_split_attention/: a small torch.nn.Module
whose torch.split / torch.chunk calls the dynamo exporter writes as
SplitToSequence -> SequenceAt, exported with torch.onnx.export(dynamo=True,
opset_version=18, optimize=False) (the exporter's optimizer would rewrite the
sequences into Split).  Needs torch and onnxscript; test_sequence_onnx.py
reads the files with numpy and onnx only.

    model.onnx      the export (metadata and doc strings dropped: a few KB)
    input_0.pb      x (2, 3, 8), from a seeded generator
    output_0.pb     the module's output in PyTorch (float32)

Deterministic: fixed seeds, no timestamps in what is kept.
"""
import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seq_split_attention")


class SplitAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):                                  # x (B, T, C) = (2, 3, 8)
        q, k, v = torch.split(self.qkv(x), 8, dim=-1)      # a chunk size: three (B, T, C)
        a = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1) @ v
        lo, hi = torch.split(a, [3, 5], dim=-1)            # sizes
        c0, c1 = torch.chunk(x, 2, dim=-1)
        return (torch.cat([hi, lo], -1) * c0.sum(-1, keepdim=True)
                + torch.stack(torch.unbind(x, 1)[::-1], 1) + c1.mean())


def strip(m):
    for n in m.graph.node:
        del n.metadata_props[:]
        n.doc_string = ""
    for v in list(m.graph.input) + list(m.graph.output) + list(m.graph.initializer):
        del v.metadata_props[:]
    del m.graph.value_info[:]
    del m.metadata_props[:]
    m.graph.doc_string = ""


def main():
    torch.manual_seed(0)
    mod = SplitAttention().eval()
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((2, 3, 8)).astype(np.float32))
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "model.onnx")
    torch.onnx.export(mod, (x,), path, dynamo=True, opset_version=18, optimize=False, external_data=False)
    m = onnx.load(path)
    strip(m)
    onnx.save(m, path)
    with torch.no_grad():
        y = mod(x).numpy()
    for name, arr in (("input_0.pb", x.numpy()), ("output_0.pb", y)):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(numpy_helper.from_array(arr).SerializeToString())
    print(path, os.path.getsize(path), "bytes:", " ".join(n.op_type for n in m.graph.node))


if __name__ == "__main__":
    main()
