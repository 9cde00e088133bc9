"""Writes the demo's input tensors (ONNX TensorProto .pb files) for
examples/mlp.nova (--dim=batch=8) and examples/transformer_block.nova
(--dim=batch=2).  Deterministic; rerun to regenerate:
    python3 examples/data/make_inputs.py
"""
import os

import numpy as np
from onnx import numpy_helper

here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(2026)


def save(folder, name, arr):
    os.makedirs(os.path.join(here, folder), exist_ok=True)
    with open(os.path.join(here, folder, name + ".pb"), "wb") as f:
        f.write(numpy_helper.from_array(arr, name).SerializeToString())


save("mlp", "x", rng.standard_normal((8, 784)).astype(np.float32))
save("mlp", "y", rng.integers(0, 10, 8).astype(np.int64))
save("transformer_block", "tokens", rng.integers(0, 64, (2, 16)).astype(np.int64))
save("transformer_block", "targets", rng.integers(0, 64, (2, 16)).astype(np.int64))
