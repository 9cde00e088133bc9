#!/usr/bin/env python3
"""CPU benchmark, one run on one machine: the same AdamW training step (same
model, weights, batch, float32, lr 1e-3) in novac, PyTorch eager,
torch.compile and JAX/XLA, and novac's sgemm against numpy/OpenBLAS.

    python3 bench/bench_cpu.py [--quick] [--threads N] [--out FILE] [--build DIR]
                               [--only mlp,gpt_block,gpt4,resnet18,mobilenet_v3_small,gemm]
                               [--systems novac,eager,compile,xla] [--keep] [--isa native|avx2]

Parts: (1) the MLP of examples/mlp.nova (784-128-10, batch 64); (2) the GPT
block of testsuite/onnx/models/gpt_block (d 32, T 8, vocab 50, batch 8);
(3) a 4-layer GPT (d 256, 4 heads, T 128, vocab 512, batch 8), defined here
in PyTorch and exported to ONNX as testsuite/onnx/models/export.py does;
(4) GEMM: novac-generated sgemm against numpy `a @ b` (OpenBLAS) on squares
(256 to 4096) and transformer shapes (K up to 4096); (5) torchvision
resnet18 and (6) mobilenet_v3_small (64 x 64 images, 10 classes, batch 2,
BatchNorm in training mode, exported with the TorchScript exporter; novac
against PyTorch eager and torch.compile).  --quick: parts 1 and 2 and the
512 GEMM, fewer repeats (about 2 minutes on a 2-core machine).

The machine's limit is measured in the same run: OpenBLAS's best sgemm
GFLOP/s on 1024 and 2048 squares with the same threads.  Each training
part reports the step's FLOP (torch.utils.flop_counter, forward and
backward), the FLOP-limited floor at that rate, and each system's share of
it; the GEMM part each novac GEMM's share of the limit.  The report's
header names the CPU model and its vector extensions, so that results from
different machines can be compared.

Every system runs in its own process pinned with taskset to the same CPUs
(--threads N: CPUs 0..N-1; default 1) with the same thread settings:
torch.set_num_threads(N), XLA_FLAGS, OMP/MKL/OPENBLAS/NOVA_NUM_THREADS=N.
All systems start from the same weights (PyTorch's, copied into novac by a
checkpoint or by the ONNX initializers, and into JAX arrays) and train on the
same batch, so their losses must agree; the script checks the first-step
loss and the loss after one AdamW update.  Times are medians of per-step
times with warm-up excluded.  A framework that is not installed is reported
as such.  Writes a markdown report to stdout and to --out
(default bench/cpu_results.md).
"""
import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MODELS_DIR = os.path.join(ROOT, "testsuite", "onnx", "models")
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)   # torch's defaults but lr
LOSS_RTOL = 1e-3
SYSTEMS = ("novac", "eager", "compile", "xla")
LABEL = {"novac": "novac", "eager": "PyTorch eager", "compile": "torch.compile",
         "xla": "JAX/XLA (jax.jit)"}

# The 4-layer GPT of part 3.
G4 = dict(D=256, HEADS=4, T=128, VOCAB=512, LAYERS=4)

WORKLOADS = {
    "mlp": dict(part=1, batch=64, title="MLP 784-128-10 (examples/mlp.nova), batch 64"),
    "gpt_block": dict(part=2, batch=8, title="GPT block (testsuite/onnx/models/gpt_block: d 32, 2 heads, "
                                              "T 8, vocab 50), batch 8"),
    "gpt4": dict(part=3, batch=8, title="4-layer GPT (d 256, 4 heads, T 128, vocab 512), batch 8"),
    "resnet18": dict(part=5, batch=2, image=64, seed=5, vs_eager=1.2,
                     title="torchvision resnet18 (64x64 images, 10 classes, BatchNorm in training mode), batch 2"),
    "mobilenet_v3_small": dict(part=6, batch=2, image=64, seed=6, vs_eager=1.2,
                               title="torchvision mobilenet_v3_small (64x64 images, 10 classes, BatchNorm in training "
                                     "mode, dropout 0), batch 2"),
}
VISION = ("resnet18", "mobilenet_v3_small")
GEMM_FULL = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
             (1024, 768, 768), (1024, 3072, 768), (1024, 768, 3072), (1024, 1024, 4096)]       # (M, N, K)
GEMM_QUICK = [(512, 512, 512)]

# Repeats: warm-up steps, time budget (s) per system and workload, min and max
# timed steps, min novarun runs (fewer, down to 1, where they would take more
# than cap_s seconds: novac's slow scalar code), timeout (s) of one process;
# for the GEMMs, budget and min runs per shape.
MODE = {
    "quick": dict(warmup=3, budget=1.0, min_steps=5, max_steps=300, novac_min=3, cap_s=10, timeout=300,
                  gemm_budget=0.5, gemm_min=3),
    "full": dict(warmup=5, budget=4.0, min_steps=10, max_steps=2000, novac_min=3, cap_s=40, timeout=1500,
                 gemm_budget=2.0, gemm_min=3),
}


# ------------------------------------------------------------ small formats

def _varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


ONNX_DTYPE = {"float32": 1, "int32": 6, "int64": 7, "float64": 11}


def write_tensor_pb(path, arr, name):
    """An ONNX TensorProto (dims, data_type, name, raw_data) without the onnx package."""
    import numpy as np
    arr = np.ascontiguousarray(arr)
    msg = bytearray()
    for d in arr.shape:
        msg += b"\x08" + _varint(d)
    msg += b"\x10" + _varint(ONNX_DTYPE[str(arr.dtype)])
    nb = name.encode()
    msg += b"\x42" + _varint(len(nb)) + nb
    raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    msg += b"\x4a" + _varint(len(raw)) + raw
    with open(path, "wb") as f:
        f.write(msg)


def read_tensor_pb(path):
    """The array of an ONNX TensorProto file with raw_data (what novarun writes)."""
    import numpy as np
    data = open(path, "rb").read()
    pos, dims, dtype, raw = 0, [], None, None

    def varint():
        nonlocal pos
        shift = val = 0
        while True:
            b = data[pos]
            pos += 1
            val |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return val
    while pos < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            v = varint()
            if field == 1:
                dims.append(v)
            elif field == 2:
                dtype = v
        elif wire == 2:
            n = varint()
            chunk, end = data[pos:pos + n], pos + n
            if field == 9:
                raw = chunk
            elif field == 1:        # packed dims
                while pos < end:
                    dims.append(varint())
            pos = end
        elif wire == 5:
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ValueError("%s: unexpected wire type %d" % (path, wire))
    np_dtype = {v: k for k, v in ONNX_DTYPE.items()}[dtype]
    if raw is None:
        raise ValueError("%s: no raw_data" % path)
    return np.frombuffer(raw, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(dims)


def write_safetensors(path, tensors, metadata):
    """A safetensors file of TENSORS (name -> numpy array), for novarun --load."""
    import numpy as np
    st_dtype = {"float32": "F32", "float64": "F64", "int32": "I32", "int64": "I64"}
    header, blobs, off = {"__metadata__": metadata}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": st_dtype[str(arr.dtype)], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------ PyTorch models

def torch_models():
    """The PyTorch modules of the three workloads (imported lazily: torch may be missing)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class MLP(nn.Module):
        """examples/mlp.nova: h = relu(x @ w1 + b1); logits = h @ w2 + b2."""
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(784, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x, y):
            logits = self.fc2(F.relu(self.fc1(x)))
            return logits, F.cross_entropy(logits, y)

    # the 4-layer GPT: export.py's GPTBlock, layers stacked, sizes as parameters
    class CausalSelfAttention(nn.Module):
        def __init__(self, d, heads, t):
            super().__init__()
            self.heads = heads
            self.q = nn.Linear(d, d)
            self.k = nn.Linear(d, d)
            self.v = nn.Linear(d, d)
            self.proj = nn.Linear(d, d)
            self.register_buffer("mask", torch.tril(torch.ones(t, t)))

        def forward(self, x):
            B, L, C = x.size()
            hs = C // self.heads
            q = self.q(x).view(B, L, self.heads, hs).transpose(1, 2)
            k = self.k(x).view(B, L, self.heads, hs).transpose(1, 2)
            v = self.v(x).view(B, L, self.heads, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            att = att.masked_fill(self.mask[:L, :L] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, L, C)
            return self.proj(y)

    class Block(nn.Module):
        def __init__(self, d, heads, t):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = CausalSelfAttention(d, heads, t)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.gelu = nn.GELU()
            self.fc_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.fc_proj(self.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self, d=G4["D"], heads=G4["HEADS"], t=G4["T"], vocab=G4["VOCAB"], layers=G4["LAYERS"]):
            super().__init__()
            self.vocab = vocab
            self.tok_emb = nn.Embedding(vocab, d)
            self.pos_emb = nn.Embedding(t, d)
            self.blocks = nn.ModuleList([Block(d, heads, t) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab)
            with torch.no_grad():   # distinct LayerNorm values, as export.py does (no merged initializers)
                for m in self.modules():
                    if isinstance(m, nn.LayerNorm):
                        m.weight.add_(0.1 * torch.randn(d))
                        m.bias.add_(0.1 * torch.randn(d))

        def forward(self, idx, targets):
            B, L = idx.size()
            pos = torch.arange(0, L, dtype=torch.long, device=idx.device)
            x = self.tok_emb(idx) + self.pos_emb(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.lm_head(self.ln_f(x))
            loss = F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))
            return logits, loss

    def gpt_block():
        sys.path.insert(0, MODELS_DIR)
        import export
        return export.GPTBlock()

    class Vision(nn.Module):
        """A torchvision classifier returning (logits, cross-entropy loss); dropout off (its masks are random)."""
        def __init__(self, name):
            super().__init__()
            import torchvision
            self.net = getattr(torchvision.models, name)(num_classes=10)
            for mod in self.net.modules():
                if isinstance(mod, nn.Dropout):
                    mod.p = 0.0

        def forward(self, x, y):
            logits = self.net(x)
            return logits, F.cross_entropy(logits, y)
    return {"mlp": MLP, "gpt_block": gpt_block, "gpt4": GPT, "resnet18": lambda: Vision("resnet18"),
            "mobilenet_v3_small": lambda: Vision("mobilenet_v3_small")}


# ------------------------------------------------------------ JAX models

def jax_loss_fn(workload):
    import jax
    import jax.numpy as jnp

    def linear(p, name, x):
        return x @ p[name + ".weight"].T + p[name + ".bias"]

    def layer_norm(p, name, x):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p[name + ".weight"] + p[name + ".bias"]

    def cross_entropy(logits, y):
        lse = jax.nn.logsumexp(logits, axis=-1)
        return jnp.mean(lse - jnp.take_along_axis(logits, y[:, None], axis=-1)[:, 0])

    if workload == "mlp":
        def loss(p, x, y):
            return cross_entropy(linear(p, "fc2", jax.nn.relu(linear(p, "fc1", x))), y)
        return loss

    heads, prefixes = (2, [""]) if workload == "gpt_block" else \
        (G4["HEADS"], ["blocks.%d." % i for i in range(G4["LAYERS"])])

    def attention(p, pre, x):
        B, L, C = x.shape
        hs = C // heads

        def split(t):
            return t.reshape(B, L, heads, hs).transpose(0, 2, 1, 3)
        q, k, v = (split(linear(p, pre + n, x)) for n in ("attn.q", "attn.k", "attn.v"))
        att = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(hs)
        att = jnp.where(jnp.tril(jnp.ones((L, L), bool)), att, -jnp.inf)
        att = jax.nn.softmax(att, axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, L, C)
        return linear(p, pre + "attn.proj", y)

    def loss(p, idx, targets):
        B, L = idx.shape
        x = p["tok_emb.weight"][idx] + p["pos_emb.weight"][:L]
        for pre in prefixes:
            x = x + attention(p, pre, layer_norm(p, pre + "ln1", x))
            h = jax.nn.gelu(linear(p, pre + "fc", layer_norm(p, pre + "ln2", x)), approximate=False)
            x = x + linear(p, pre + "fc_proj", h)
        logits = linear(p, "lm_head", layer_norm(p, "ln_f", x))
        return cross_entropy(logits.reshape(B * L, -1), targets.reshape(-1))
    return loss


# ------------------------------------------------------------ workers (pinned subprocesses)

def timed_steps(step, sync, warmup, budget, min_n, max_n, losses=True):
    """Runs STEP WARMUP times then until BUDGET seconds (MIN_N..MAX_N steps);
    returns the warm-up times, the timed per-step times and (LOSSES) the
    first two results as floats."""
    warm, losses_out = [], []
    for i in range(warmup):
        t0 = time.perf_counter()
        r = step()
        sync(r)
        warm.append(time.perf_counter() - t0)
        if i < 2 and losses:
            losses_out.append(float(r))
    times, start = [], time.perf_counter()
    while len(times) < max_n and (len(times) < min_n or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        sync(step())
        times.append(time.perf_counter() - t0)
    return warm, times, losses_out


def torch_peak_bytes(torch, model, opt, inputs, fwd_bwd_step):
    """Peak bytes of one steady training step: the tensors alive before it
    (parameters, buffers, optimizer state, batch; gradients freed by
    zero_grad first) plus the highest point of the CPU allocator's allocations
    and frees during the step, from torch.profiler(profile_memory=True)."""
    from torch.profiler import ProfilerActivity, profile
    opt.zero_grad(set_to_none=True)
    seen, pre = set(), 0

    def add(t):
        nonlocal pre
        if isinstance(t, torch.Tensor):
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                pre += key[1]
    for t in list(model.parameters()) + list(model.buffers()) + list(inputs):
        add(t)
    for st in opt.state.values():
        for t in st.values():
            add(t)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fwd_bwd_step()
    mem = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    cur = peak = 0
    for e in sorted(mem, key=lambda e: e.start_ns()):
        cur += e.nbytes()
        peak = max(peak, cur)
    return pre + peak


def proc_status_bytes(field):
    """VmRSS, VmHWM, ... of this process from /proc/self/status, in bytes (None if unknown)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_growth(rss0):
    hwm = proc_status_bytes("VmHWM")
    return hwm - rss0 if hwm is not None and rss0 is not None else None


def worker_torch(job):
    import numpy as np
    import torch
    torch.set_num_threads(job["threads"])
    torch.ones(8) @ torch.ones(8)
    rss0 = proc_status_bytes("VmRSS")
    compiled = job["system"] == "compile"
    if compiled:
        import torch._inductor.config as ic
        ic.compile_threads = job["threads"]
    model = torch_models()[job["workload"]]()
    weights = dict(np.load(job["weights"]))
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("attn.mask")]    # buffers built by the model
    if missing or unexpected:
        raise SystemExit("weights do not fit the model: missing %s, unexpected %s" % (missing, unexpected))
    model.train()
    data = np.load(job["data"])
    inputs = [torch.from_numpy(data[n]) for n in job["inputs"]]
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    fwd = torch.compile(model) if compiled else model
    if compiled:
        @torch.compile
        def opt_step():
            opt.step()
    else:
        opt_step = opt.step

    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = fwd(*inputs)
        loss.backward()
        opt_step()
        return loss.detach()

    def fwd_bwd_step():
        _, loss = fwd(*inputs)
        loss.backward()
        opt_step()

    warm, times, losses = timed_steps(step, lambda r: None, job["warmup"], job["budget"], job["min_steps"],
                                      job["max_steps"])
    med = statistics.median(times)
    res = {"ms": med * 1e3, "steps": len(times), "losses": losses, "warmup_ms": [t * 1e3 for t in warm],
           "torch": torch.__version__}
    if compiled:   # compile time: what the warm-up steps took beyond steady steps
        res["compile_s"] = sum(max(0.0, t - med) for t in warm)
    res["rss_growth_bytes"] = rss_growth(rss0)
    if not compiled:   # the step's FLOP (forward and backward), as PyTorch counts them
        try:
            from torch.utils.flop_counter import FlopCounterMode
            with FlopCounterMode(display=False) as fc:
                _, loss = model(*inputs)
                loss.backward()
            res["flop"] = float(fc.get_total_flops())
        except Exception as e:   # noqa: BLE001
            res["flop_error"] = str(e)
    try:
        res["peak_bytes"] = torch_peak_bytes(torch, model, opt, inputs, fwd_bwd_step)
        res["peak_how"] = "torch.profiler"
    except Exception as e:   # noqa: BLE001 — a private profiler API; fall back to the RSS growth
        res["peak_bytes"], res["peak_how"] = res["rss_growth_bytes"], "max-RSS growth; profiler: %s" % e
    return res


def worker_xla(job):
    import numpy as np
    import jax
    import jax.numpy as jnp
    jnp.ones(8).block_until_ready()
    rss0 = proc_status_bytes("VmRSS")
    loss_fn = jax_loss_fn(job["workload"])
    weights = dict(np.load(job["weights"]))
    params = {k: jnp.asarray(v) for k, v in weights.items() if not k.endswith("attn.mask")}
    data = np.load(job["data"])
    inputs = [jnp.asarray(data[n].astype(np.int32) if data[n].dtype == np.int64 else data[n])
              for n in job["inputs"]]
    lr, (b1, b2), eps, wd = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]

    def train_step(p, st, *batch):
        loss, g = jax.value_and_grad(loss_fn)(p, *batch)
        t = st["t"] + 1.0          # torch.optim.AdamW, decoupled weight decay, written out
        bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, st["m"], g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, st["v"], g)
        p = jax.tree_util.tree_map(
            lambda p_, m_, v_: p_ * (1 - lr * wd) - (lr / bc1) * m_ / (jnp.sqrt(v_) / jnp.sqrt(bc2) + eps),
            p, m, v)
        return loss, p, {"t": t, "m": m, "v": v}

    st = {"t": jnp.zeros((), jnp.float32), "m": jax.tree_util.tree_map(jnp.zeros_like, params),
          "v": jax.tree_util.tree_map(jnp.zeros_like, params)}
    jitted = jax.jit(train_step, donate_argnums=(0, 1))
    t0 = time.perf_counter()
    lowered = jitted.lower(params, st, *inputs)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    ma = compiled.memory_analysis()
    box = [params, st]

    def step():
        loss, box[0], box[1] = compiled(box[0], box[1], *inputs)
        return loss

    warm, times, losses = timed_steps(step, lambda r: r.block_until_ready(), job["warmup"], job["budget"],
                                      job["min_steps"], job["max_steps"])
    res = {"ms": statistics.median(times) * 1e3, "steps": len(times), "losses": losses,
           "warmup_ms": [t * 1e3 for t in warm], "compile_s": t2 - t0, "lower_s": t1 - t0,
           "jax": jax.__version__, "rss_growth_bytes": rss_growth(rss0)}
    if ma is not None:
        res["peak_bytes"] = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                             - ma.alias_size_in_bytes)
        res["peak_how"] = "memory_analysis"
        res["memory_analysis"] = {k: getattr(ma, k) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                              "temp_size_in_bytes", "alias_size_in_bytes")}
    return res


def worker_numpy_peak(job):
    """The machine's sgemm limit on these threads: OpenBLAS's best GFLOP/s on squares."""
    import numpy as np
    best = 0.0
    for n in job["sizes"]:
        a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        _, times, _ = timed_steps(lambda: a @ a, lambda r: None, 2, job["budget"], 3, 200, losses=False)
        best = max(best, 2.0 * n ** 3 / statistics.median(times) / 1e9)
    return {"gflops": best, "sizes": job["sizes"]}


def worker_numpy_gemm(job):
    import numpy as np
    res = []
    for shape, (fa, fb) in zip(job["shapes"], job["files"]):
        a, b = np.load(fa), np.load(fb)
        c = a @ b
        ref = np.load(job["refs"][len(res)])
        err = float(np.linalg.norm(c.astype(np.float64) - ref) / np.linalg.norm(ref))
        _, times, _ = timed_steps(lambda: a @ b, lambda r: None, 2, job["budget"], job["min_steps"], 1000,
                                 losses=False)
        res.append({"shape": shape, "ms": statistics.median(times) * 1e3, "runs": len(times), "rel_err": err})
    return {"gemm": res, "numpy": np.__version__}


def worker_main(path):
    job = json.load(open(path))
    kind = job["system"]
    try:
        if kind in ("eager", "compile"):
            res = worker_torch(job)
        elif kind == "xla":
            res = worker_xla(job)
        elif kind == "numpy":
            res = worker_numpy_gemm(job)
        elif kind == "numpy-peak":
            res = worker_numpy_peak(job)
        else:
            raise SystemExit("unknown worker " + kind)
    except ImportError as e:
        res = {"error": "not installed (%s)" % e}
    with open(job["result"], "w") as f:
        json.dump(res, f)


# ------------------------------------------------------------ the orchestrator

class Bench:
    def __init__(self, args):
        self.args = args
        self.mode = MODE["quick" if args.quick else "full"]
        self.tmp = tempfile.mkdtemp(prefix="nova-bench-cpu-")
        self.novac_bin = os.path.join(args.build, "bin", "novac")
        self.novarun_bin = os.path.join(args.build, "bin", "novarun")
        allowed = sorted(os.sched_getaffinity(0))
        if args.threads < 1 or args.threads > len(allowed):
            sys.exit("--threads must be 1..%d (the CPUs this process may use)" % len(allowed))
        self.cpus = allowed[:args.threads]
        n = str(args.threads)
        self.env = dict(os.environ)
        self.env.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, NOVA_NUM_THREADS=n,
                        XLA_FLAGS=("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
                                   if args.threads == 1 else
                                   "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=%d"
                                   % args.threads),
                        TORCHINDUCTOR_CACHE_DIR=os.path.join(self.tmp, "inductor-cache"),   # cold compiles
                        PYTHONWARNINGS="ignore", TF_CPP_MIN_LOG_LEVEL="3")
        self.novac_flags = []
        if args.isa == "avx2":   # the AVX2 code on an AVX-512 machine, for every system that can be told
            self.env.update(NOVA_CONTRACT_ISA="avx2", OPENBLAS_CORETYPE="Haswell", ATEN_CPU_CAPABILITY="avx2",
                            ONEDNN_MAX_CPU_ISA="AVX2", XLA_FLAGS=self.env["XLA_FLAGS"] +
                            " --xla_cpu_max_isa=AVX2")
            dev = os.path.join(self.tmp, "avx2.json")
            with open(dev, "w") as f:
                json.dump(avx2_device(), f)
            self.novac_flags = ["--cpu=x86-64-v3", "--device=" + dev]
        self.taskset = shutil.which("taskset")
        self.systems = [s for s in args.systems.split(",") if s] or list(SYSTEMS)
        if any(s not in SYSTEMS for s in self.systems):
            sys.exit("--systems: a comma-separated subset of %s" % ",".join(SYSTEMS))
        self.log = []

    def pinned(self, cmd):
        cpus = ",".join(str(c) for c in self.cpus)
        if self.taskset:
            return [self.taskset, "-c", cpus] + cmd, None
        return cmd, (lambda: os.sched_setaffinity(0, self.cpus))

    def run(self, cmd, timeout=None, **kw):
        full, pre = self.pinned(cmd)
        self.log.append(" ".join(full))
        return subprocess.run(full, env=self.env, preexec_fn=pre, capture_output=True, text=True,
                              timeout=timeout or self.mode["timeout"], **kw)

    def say(self, msg):
        print("[bench_cpu %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)

    # -------------------------------------------------- workers
    def worker(self, system, job):
        job = dict(job, system=system, threads=self.args.threads,
                   result=os.path.join(self.tmp, "result-%s-%s.json" % (system, job.get("workload", "gemm"))))
        path = job["result"] + ".job"
        with open(path, "w") as f:
            json.dump(job, f)
        t0 = time.perf_counter()
        try:
            p = self.run([sys.executable, os.path.abspath(__file__), "--worker", path])
        except subprocess.TimeoutExpired:
            return {"error": "timed out after %d s" % self.mode["timeout"]}
        wall = time.perf_counter() - t0
        if p.returncode != 0 or not os.path.exists(job["result"]):
            lines = [l for l in (p.stderr or "").strip().splitlines() if l.strip()]
            return {"error": "failed (exit %d): %s" % (p.returncode, lines[-1][:200] if lines else "no output")}
        res = json.load(open(job["result"]))
        res["wall_s"] = wall
        return res

    # -------------------------------------------------- novac
    def novac_compile(self, model, flags, out):
        t0 = time.perf_counter()
        try:
            p = self.run([self.novac_bin, model] + flags + self.novac_flags + ["-o", out])
        except subprocess.TimeoutExpired:
            return None, "novac timed out after %d s" % self.mode["timeout"]
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            errs = [l for l in p.stderr.splitlines() if "error" in l] or p.stderr.strip().splitlines() or ["?"]
            return None, "compile failed: " + errs[0][:240]
        return wall, None

    def novarun(self, args):
        try:
            p = self.run([self.novarun_bin] + args)
        except subprocess.TimeoutExpired:
            return None, "novarun timed out after %d s" % self.mode["timeout"]
        if p.returncode != 0:
            lines = p.stderr.strip().splitlines() or ["?"]
            return None, "novarun failed: " + lines[-1][:240]
        return p.stderr, None

    @staticmethod
    def per_run_ms(text):
        m = re.search(r"([0-9.]+) (ms|us) per run", text)
        return float(m.group(1)) * (1e-3 if m.group(2) == "us" else 1.0)

    def repeats_for(self, est_ms, budget, lo, hi=2000):
        """Runs of about EST_MS each to fill BUDGET s (LO..HI of them); fewer,
        down to 1, where LO runs would take more than the mode's cap_s."""
        n = int(max(lo, min(hi, math.ceil(budget * 1e3 / max(est_ms, 1e-3)))))
        if n * est_ms > self.mode["cap_s"] * 1e3:
            n = max(1, int(self.mode["cap_s"] * 1e3 // max(est_ms, 1e-3)))
        return n

    def novac_train(self, wl, spec):
        d = os.path.join(self.tmp, "novac-" + wl)
        os.makedirs(os.path.join(d, "in"), exist_ok=True)
        so = os.path.join(d, "step.so")
        flags = ["--dim=batch=%d" % WORKLOADS[wl]["batch"], "--train", "--optimizer=adamw", "--lr=1e-3"]
        compile_s, err = self.novac_compile(spec["novac_model"], flags, so)
        model = spec["novac_model"]
        shown = os.path.relpath(model, ROOT) if model.startswith(ROOT + os.sep) else \
            "$TMP/" + os.path.relpath(model, self.tmp)
        res = {"compile_s": compile_s, "command": "novac %s %s -o step.so" % (shown, " ".join(flags))}
        if err:
            res["error"] = err
            return res
        import numpy as np
        try:
            manifest = json.load(open(os.path.join(d, "step.json")))
        except (OSError, ValueError) as e:
            res["error"] = "no manifest: %s" % e
            return res
        res["manifest_memory"] = manifest.get("memory", {})
        res["llvm_cpu"] = manifest.get("device", {}).get("cpu")
        data = np.load(spec["data"])
        for n in spec["inputs"]:
            write_tensor_pb(os.path.join(d, "in", n + ".pb"), data[n], n)
        base = [so, "--inputs", os.path.join(d, "in")]
        if "novac_state" in spec:    # PyTorch's initial weights, through a checkpoint
            state = spec["novac_state"](manifest)
            ck = os.path.join(d, "init.safetensors")
            write_safetensors(ck, state, {"format": "novac", "graph_hash": manifest.get("graph_hash", ""),
                                          "step": "0"})
            base += ["--load", ck]
        log = os.path.join(d, "loss.log")
        out, err = self.novarun(base + ["--steps", "2", "--loss-log", log])
        try:       # also after a failure: a diverged step logs its loss (nan) first
            res["losses"] = [float(l.split()[1]) for l in open(log) if l.strip()]
        except (OSError, ValueError, IndexError):
            pass
        if err:
            res["error"] = err
            return res
        m = re.search(r"\(([0-9.]+) ms/step\)", out)
        est = float(m.group(1)) if m else 1000.0
        n = self.repeats_for(est, self.mode["budget"], self.mode["novac_min"], self.mode["max_steps"])
        out, err = self.novarun(base + ["--repeat", str(n)])
        if err:
            res["error"] = err
            return res
        res.update(ms=self.per_run_ms(out), steps=n)
        return res

    # -------------------------------------------------- workloads
    def prepare(self, wl):
        """Weights (PyTorch names and layouts), the batch, and the model novac compiles."""
        import numpy as np
        rng = np.random.default_rng(WORKLOADS[wl]["part"])
        d = os.path.join(self.tmp, wl)
        os.makedirs(d, exist_ok=True)
        spec = {"weights": os.path.join(d, "weights.npz"), "data": os.path.join(d, "data.npz")}
        if wl == "mlp":
            def lin(i, o):   # nn.Linear's default initialization
                k = 1 / math.sqrt(i)
                return (rng.uniform(-k, k, (o, i)).astype(np.float32), rng.uniform(-k, k, o).astype(np.float32))
            w1, b1 = lin(784, 128)
            w2, b2 = lin(128, 10)
            weights = {"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}
            data = {"x": rng.standard_normal((64, 784)).astype(np.float32),
                    "y": rng.integers(0, 10, 64).astype(np.int64)}
            spec["inputs"] = ["x", "y"]
            spec["novac_model"] = os.path.join(ROOT, "examples", "mlp.nova")
            ours = {"w1": w1.T, "b1": b1, "w2": w2.T, "b2": b2}

            def novac_state(manifest):
                st = {}
                for t in manifest["tensors"]:
                    if t["role"] == "param":
                        st[t["name"]] = np.ascontiguousarray(ours[t["name"]])
                    elif t["role"] == "opt_state":
                        st[t["name"]] = np.zeros(t["shape"], dtype={"f32": np.float32, "f64": np.float64,
                                                                     "i64": np.int64, "i32": np.int32}[t["dtype"]])
                return st
            spec["novac_state"] = novac_state
        elif wl == "gpt_block":
            import onnx
            from onnx import numpy_helper
            mdir = os.path.join(MODELS_DIR, "gpt_block")
            ref = json.load(open(os.path.join(mdir, "reference.json")))
            inits = {i.name: numpy_helper.to_array(i)
                     for i in onnx.load(os.path.join(mdir, "model.onnx")).graph.initializer}
            weights = {}
            for p in ref["parameters"]:
                a = inits[p["initializer"]]
                weights[p["torch"]] = np.ascontiguousarray(a.T if p["layout"] == "transposed" else a)
            data = {"idx": rng.integers(0, 50, (8, 8)).astype(np.int64),
                    "targets": rng.integers(0, 50, (8, 8)).astype(np.int64)}
            spec["inputs"] = ["idx", "targets"]
            spec["novac_model"] = os.path.join(mdir, "model.onnx")
        elif wl in VISION:
            S, B = WORKLOADS[wl]["image"], WORKLOADS[wl]["batch"]
            data = {"x": rng.standard_normal((B, 3, S, S)).astype(np.float32),
                    "y": rng.integers(0, 10, B).astype(np.int64)}
            weights, onnx_path = self.export_vision(wl, d, data)
            spec["inputs"] = ["x", "y"]
            spec["novac_model"] = onnx_path
        else:
            weights, onnx_path = self.export_gpt4(d)
            T, V, B = G4["T"], G4["VOCAB"], WORKLOADS[wl]["batch"]
            data = {"idx": rng.integers(0, V, (B, T)).astype(np.int64),
                    "targets": rng.integers(0, V, (B, T)).astype(np.int64)}
            spec["inputs"] = ["idx", "targets"]
            spec["novac_model"] = onnx_path
        np.savez(spec["weights"], **weights)
        np.savez(spec["data"], **data)
        return spec

    def export_gpt4(self, d):
        """The 4-layer GPT with seed 3, exported as export.py does (TorchScript
        exporter, dynamo=False, opset 17, constant folding, symbolic batch)."""
        import io
        import numpy as np
        import onnx
        import torch
        sys.path.insert(0, MODELS_DIR)
        import export
        torch.manual_seed(3)
        model = torch_models()["gpt4"]().eval()
        g = torch.Generator().manual_seed(1003)
        T, V = G4["T"], G4["VOCAB"]
        idx = torch.randint(0, V, (2, T), generator=g)
        tgt = torch.randint(0, V, (2, T), generator=g)
        names = ("idx", "targets")
        dyn = {n: {0: "batch"} for n in names}
        dyn["logits"] = {0: "batch"}
        buf = io.BytesIO()
        import warnings
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (idx, tgt), buf, dynamo=False, opset_version=export.OPSET,
                              input_names=list(names), output_names=["logits", "loss"], dynamic_axes=dyn,
                              do_constant_folding=True, export_params=True, keep_initializers_as_inputs=False)
        om = onnx.load_from_string(buf.getvalue())
        export.map_parameters(model, om)    # exits unless every parameter is one initializer of its own
        path = os.path.join(d, "model.onnx")
        with open(path, "wb") as f:
            f.write(buf.getvalue())
        weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()
                   if not k.endswith("attn.mask")}
        return weights, path

    def export_vision(self, wl, d, data):
        """A torchvision model, seeded, exported for training (TorchScript
        exporter, opset 17, BatchNorm in training mode, no constant folding)."""
        import numpy as np
        import torch
        torch.manual_seed(WORKLOADS[wl]["seed"])
        model = torch_models()[wl]().train()
        path = os.path.join(d, "model.onnx")
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.from_numpy(data["x"]), torch.from_numpy(data["y"])), path, dynamo=False,
                              opset_version=17, input_names=["x", "y"], output_names=["logits", "loss"],
                              dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}, "logits": {0: "batch"}},
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
        # (the export ran the model once: its BatchNorm statistics moved; the weights are those of before)
        torch.manual_seed(WORKLOADS[wl]["seed"])
        fresh = torch_models()[wl]()
        weights = {k: v.detach().numpy().copy() for k, v in fresh.state_dict().items()}
        return weights, path

    def train_workload(self, wl):
        self.say("part %d: %s" % (WORKLOADS[wl]["part"], WORKLOADS[wl]["title"]))
        rows = {}
        have_torch, have_onnx = self.have("torch"), self.have("onnx")
        if wl == "gpt_block" and not have_onnx:
            return {s: {"error": "onnx not installed (needed to read the model's weights)", "skipped": True}
                    for s in SYSTEMS}
        if wl in VISION and not self.have("torchvision"):
            return {s: {"error": "torchvision not installed (needed to define and export the model)", "skipped": True}
                    for s in SYSTEMS}
        if wl in ("gpt4",) + VISION and not (have_torch and have_onnx):
            return {s: {"error": "%s not installed (needed to define and export the model)"
                        % ("torch" if not have_torch else "onnx"), "skipped": True} for s in SYSTEMS}
        try:
            spec = self.prepare(wl)
        except (Exception, SystemExit) as e:   # noqa: BLE001 — reported in the table
            return {s: {"error": "preparing the workload failed: %s" % e, "skipped": True} for s in SYSTEMS}
        job = {"workload": wl, "weights": spec["weights"], "data": spec["data"], "inputs": spec["inputs"],
               "warmup": self.mode["warmup"], "budget": self.mode["budget"],
               "min_steps": self.mode["min_steps"], "max_steps": self.mode["max_steps"]}
        for s in SYSTEMS:
            t0 = time.perf_counter()
            if s not in self.systems:
                rows[s] = {"error": "skipped (--systems)"}
            elif s == "novac":
                rows[s] = self.novac_train(wl, spec)
            elif s in ("eager", "compile") and not have_torch:
                rows[s] = {"error": "not installed (torch)"}
            elif s == "xla" and not self.have("jax"):
                rows[s] = {"error": "not installed (jax)"}
            elif s == "xla" and wl in VISION:
                rows[s] = {"error": "not measured (no JAX definition of this model here)"}
            else:
                rows[s] = self.worker(s, job)
            r = rows[s]
            self.say("  %-18s %s  (%.1f s)" % (LABEL[s], r["error"] if "error" in r else
                                                "%.3f ms/step, losses %s" % (r["ms"], r.get("losses")),
                                                time.perf_counter() - t0))
        return rows

    def gemm(self, shapes):
        import numpy as np
        self.say("part 4: GEMM %s" % ", ".join("%dx%dx%d" % s for s in shapes))
        d = os.path.join(self.tmp, "gemm")
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(4)
        rows, files, refs = [], [], []
        shapes_run = []
        rate = None      # the lowest GFLOP/s novac reached so far, to size the runs of the next shape
        for (M, N, K) in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
            a = rng.standard_normal((M, K)).astype(np.float32)
            b = rng.standard_normal((K, N)).astype(np.float32)
            tag = "%dx%dx%d" % (M, N, K)
            sd = os.path.join(d, tag)
            os.makedirs(os.path.join(sd, "in"), exist_ok=True)
            fa, fb, fr = (os.path.join(sd, n) for n in ("a.npy", "b.npy", "ref.npy"))
            np.save(fa, a)
            np.save(fb, b)
            ref = a.astype(np.float64) @ b.astype(np.float64)
            np.save(fr, ref)
            files.append((fa, fb))
            refs.append(fr)
            row = {"shape": (M, N, K)}
            rows.append(row)
            shapes_run.append((M, N, K))
            src = os.path.join(sd, "gemm.nova")
            with open(src, "w") as f:
                f.write("input a: f32[M, K]\ninput b: f32[K, N]\nc = matmul(a, b)\noutput c\n")
            so = os.path.join(sd, "gemm.so")
            cs, err = self.novac_compile(src, ["--dim=M=%d" % M, "--dim=N=%d" % N, "--dim=K=%d" % K], so)
            row["compile_s"] = cs
            if err:
                row["error"] = err
                continue
            write_tensor_pb(os.path.join(sd, "in", "a.pb"), a, "a")
            write_tensor_pb(os.path.join(sd, "in", "b.pb"), b, "b")
            run = [so, "--inputs", os.path.join(sd, "in")]
            flop = 2.0 * M * N * K
            if rate is None:    # a first run to size the timed ones
                out, err = self.novarun(run + ["--repeat", "1"])
                if err:
                    row["error"] = err
                    continue
                est = self.per_run_ms(out)
            else:
                est = flop / (rate * 1e6)
            n = self.repeats_for(est, self.mode["gemm_budget"], self.mode["gemm_min"], 1000)
            out, err = self.novarun(run + ["--outputs", os.path.join(sd, "out"), "--repeat", str(n)])
            if err:
                row["error"] = err
                continue
            c = read_tensor_pb(os.path.join(sd, "out", "output_0.pb")).astype(np.float64)
            row["rel_err"] = float(np.linalg.norm(c - ref) / np.linalg.norm(ref))
            row.update(ms=self.per_run_ms(out), runs=n)
            rate = min(rate or 1e30, flop / (row["ms"] * 1e6))
            self.say("  novac %s: %.3f ms (%d runs), rel. error %.2g" % (tag, row["ms"], n, row["rel_err"]))
        blas = self.worker("numpy", {"shapes": shapes_run, "files": files, "refs": refs,
                                     "budget": self.mode["gemm_budget"], "min_steps": self.mode["gemm_min"]})
        for row in rows:
            if "error" in blas:
                row["blas_error"] = blas["error"]
                continue
            b = [x for x in blas["gemm"] if tuple(x["shape"]) == row["shape"]][0]
            row.update(blas_ms=b["ms"], blas_runs=b["runs"], blas_rel_err=b["rel_err"])
            self.say("  numpy %dx%dx%d: %.3f ms (%d runs)" % (row["shape"] + (b["ms"], b["runs"])))
        return sorted(rows, key=lambda r: shapes.index(r["shape"]))

    def have(self, mod):
        return importlib.util.find_spec(mod) is not None


# ------------------------------------------------------------ the report

def version_of(dist):
    try:
        import importlib.metadata as md
        return md.version(dist)
    except Exception:   # noqa: BLE001
        return None


def avx2_device():
    """This machine's caches and cores as an AVX2 CPU (256-bit vectors, 16 registers), for novac --device."""
    def cache(index, default):
        try:
            v = open("/sys/devices/system/cpu/cpu0/cache/index%d/size" % index).read().strip()
            return int(v[:-1]) * {"K": 1024, "M": 1 << 20}[v[-1]] if v[-1] in "KM" else int(v)
        except (OSError, ValueError):
            return default
    return {"name": "avx2", "kind": "cpu", "peak_tflops_fp32": 0.1, "peak_tflops_tf32": 0, "peak_tflops_fp16": 0,
            "peak_tflops_bf16": 0, "mem_bw_gbs": 50, "l2_bytes": cache(2, 1 << 20), "cores": os.cpu_count(),
            "vector_bits": 256, "vector_regs": 16, "l1d_bytes": cache(0, 32768), "l3_bytes": cache(3, 0),
            "fma_units": 2}


def machine_info(bench):
    info = {}
    model, flags = "?", ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1]
    except OSError:
        pass
    simd = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile") if f in flags.split()]
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = "%.1f GiB" % (int(line.split()[1]) / 2 ** 20)
    except OSError:
        pass
    info["cpu"] = "%s (%s), %s; %d logical CPUs; %s memory" % (model, platform.machine(), " ".join(simd) or "-",
                                                               os.cpu_count(), mem)
    try:
        info["novac"] = subprocess.run([bench.novac_bin, "--version"], capture_output=True, text=True,
                                       timeout=30).stdout.strip().splitlines()[0]
    except Exception:   # noqa: BLE001
        info["novac"] = "?"
    vs = []
    for dist in ("torch", "jax", "jaxlib", "numpy", "onnx"):
        vs.append("%s %s" % (dist, version_of(dist) or "not installed"))
    try:
        import numpy as np
        blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
        vs.append("numpy BLAS: %s %s" % (blas.get("name"), blas.get("version")))
    except Exception:   # noqa: BLE001
        pass
    info["versions"] = "; ".join(vs) + "; Python %s" % platform.python_version()
    return info


def fmt(v, f="%.3f"):
    return "—" if v is None else f % v


def mib(b):
    return None if b is None else b / 2 ** 20


def met(ok):
    return "**met**" if ok else "not met"


def short(err, n=90):
    """ERR cut for a table cell."""
    err = err.replace("|", "/").replace("\n", " ")
    return err if len(err) <= n else err[:n - 3] + "..."


def train_section(wl, rows, targets, peak=None):
    out = ["## Part %d: training step — %s" % (WORKLOADS[wl]["part"], WORKLOADS[wl]["title"]), ""]
    nv = rows.get("novac", {})
    nv_ms = nv.get("ms")
    ref_losses = rows.get("eager", {}).get("losses") or nv.get("losses")
    mm = nv.get("manifest_memory") or {}
    if "planned_peak_bytes" in mm:
        nv_mem = mm["planned_peak_bytes"]
        nv_mem_how = "planned_peak_bytes %.2f MiB = tensor_bytes %.2f + arena %.2f MiB" % (
            mib(nv_mem), mib(mm.get("tensor_bytes", 0)), mib(mm.get("arena_bytes", 0)))
        if "intermediate_bytes" in mm:
            nv_mem_how += " (intermediates %.2f MiB before reuse)" % mib(mm["intermediate_bytes"])
    elif "tensor_bytes" in mm:
        nv_mem, nv_mem_how = None, "tensor_bytes %.2f MiB + intermediates: %s (not planned)" % (
            mib(mm["tensor_bytes"]), mm.get("intermediates", "?"))
    else:
        nv_mem, nv_mem_how = None, "—"
    flop = rows.get("eager", {}).get("flop")
    floor_ms = flop / (peak * 1e6) if flop and peak else None
    if flop:
        out.append("FLOP per step (forward and backward, torch.utils.flop_counter): %.2f GFLOP; floor at the "
                   "measured sgemm limit: %s ms." % (flop / 1e9, fmt(floor_ms, "%.1f")))
        out.append("")
    out.append("| system | ms/step (median) | timed steps | novac speedup (system ms / novac ms) | share of the "
               "FLOP floor | first-step loss | rel. diff vs eager | loss after 1 step | compile s | peak memory MiB | "
               "novac mem / system mem |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    max_diff = max_diff1 = 0.0
    for s in SYSTEMS:
        r = rows.get(s, {})
        losses = r.get("losses") or []
        diffs = []
        for k in range(min(2, len(losses), len(ref_losses or []))):
            dk = abs(losses[k] - ref_losses[k]) / max(abs(ref_losses[k]), 1e-30)
            diffs.append(dk if math.isfinite(dk) else math.inf)
        if diffs:
            max_diff = max(max_diff, diffs[0])
        if len(diffs) > 1:
            max_diff1 = max(max_diff1, diffs[1])
        if "error" in r and "ms" not in r:
            extra = ""
            if s == "novac" and r.get("compile_s") is not None:
                extra = " (compile %.2f s)" % r["compile_s"]
            if losses:
                extra += "; losses logged: %s" % ", ".join("%g" % x for x in losses)
            out.append("| %s | %s%s | | | | | | | | | |" % (LABEL[s], r["error"].replace("|", "/"), extra))
            continue
        ratio = r["ms"] / nv_ms if nv_ms and s != "novac" else None
        if s == "novac":
            mem_s, mem_ratio = (fmt(mib(nv_mem), "%.2f") + " (planned)") if nv_mem is not None else nv_mem_how, "—"
        else:
            pb = r.get("peak_bytes")
            mem_s = "%.2f (%s)" % (mib(pb), r.get("peak_how")) if pb is not None else "—"
            mem_ratio = "%.2f" % (nv_mem / pb) if pb and nv_mem is not None else "—"
        out.append("| %s | %.3f | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            LABEL[s], r["ms"], r.get("steps", 0), fmt(ratio, "%.2fx") if ratio else "—",
            "%.0f%%" % (100 * floor_ms / r["ms"]) if floor_ms else "—",
            fmt(losses[0], "%.6f") if losses else "—", fmt(diffs[0], "%.1e") if diffs else "—",
            ("%.6f (%.1e)" % (losses[1], diffs[1])) if len(diffs) > 1 else "—",
            fmt(r.get("compile_s"), "%.2f"), mem_s, mem_ratio))
    out.append("")
    # targets
    out.append("| target | measured | |")
    out.append("|---|---:|---|")

    def target(name, value, ok):
        out.append("| %s | %s | %s |" % (name, value, ok if isinstance(ok, str) else met(ok)))
        targets.append((WORKLOADS[wl]["part"], name, value, ok if isinstance(ok, str) else met(ok)))
    vs = WORKLOADS[wl].get("vs_eager", 1.5)
    for s, need, name in (("eager", vs, "novac >= %gx faster than PyTorch eager" % vs),
                          ("compile", 1.2, "novac >= 1.2x faster than torch.compile"),
                          ("xla", 1.3, "novac >= 1.3x faster than JAX/XLA")):
        if wl in VISION and s != "eager":
            continue
        r = rows.get(s, {})
        if nv.get("skipped"):
            target(name, short(nv.get("error", "no result")), "not measured")
        elif nv_ms is None:
            target(name, "novac: " + short(nv.get("error", "no result")), "not met")
        elif "ms" not in r:
            target(name, LABEL[s] + ": " + short(r.get("error", "no result")), "not measured")
        else:
            target(name, "%.2fx" % (r["ms"] / nv_ms), r["ms"] / nv_ms >= need)
    eager_mem = rows.get("eager", {}).get("peak_bytes")
    mem_name = "novac planned peak memory <= 0.7x PyTorch eager's"
    if nv.get("skipped"):
        target(mem_name, short(nv.get("error", "no result")), "not measured")
    elif nv_mem is not None and eager_mem:
        target(mem_name, "%.2fx" % (nv_mem / eager_mem), nv_mem <= 0.7 * eager_mem)
    elif nv_mem is not None:
        target(mem_name, "PyTorch eager: " + short(rows.get("eager", {}).get("error", "no result")),
               "not measured")
    else:
        lower = ""
        if mm.get("tensor_bytes") and eager_mem:
            lower = "; its tensors alone: %.2fx" % (mm["tensor_bytes"] / eager_mem)
        target("novac planned peak memory <= 0.7x PyTorch eager's",
               "no planned peak in the manifest%s" % lower if nv_ms or mm else "novac: no result", "not met")
    if wl == "gpt4":
        name = "novac >= 60% of the FLOP-limited floor"
        if floor_ms and nv_ms:
            target(name, "%.0f%%" % (100 * floor_ms / nv_ms), floor_ms / nv_ms >= 0.6)
        else:
            target(name, "no FLOP count or no sgemm limit measured", "not measured")
        cs = nv.get("compile_s")
        if nv.get("skipped"):
            target("novac train-step compile < 2 s", short(nv["error"]), "not measured")
        else:
            target("novac train-step compile < 2 s", "%.2f s" % cs if cs is not None else "novac: no result",
                   cs is not None and cs < 2.0)
    n_loss = sum(1 for s in SYSTEMS if rows.get(s, {}).get("losses"))
    loss_name = "first-step losses agree within %g relative (%d systems)" % (LOSS_RTOL, n_loss)
    if nv.get("skipped"):
        target(loss_name, short(nv.get("error", "no result")), "not measured")
    elif not nv.get("losses") and "novac" in rows and "skipped (" not in nv.get("error", ""):
        target(loss_name, "novac: no loss (%s)" % short(nv.get("error", "no result"), 60), "not met")
    else:
        target(loss_name, "max %.1e (after 1 AdamW step: %.1e)" % (max_diff, max_diff1),
               max_diff <= LOSS_RTOL if n_loss >= 2 else "not measured")
    out.append("")
    notes = []
    if nv.get("command"):
        notes.append("novac: `%s`, compile %s s (wall, pinned); memory: %s." % (
            nv["command"], fmt(nv.get("compile_s"), "%.2f"), nv_mem_how))
    x = rows.get("xla", {})
    if x.get("memory_analysis"):
        ma = x["memory_analysis"]
        notes.append("XLA memory_analysis: arguments %.2f + outputs %.2f + temp %.2f - aliased (donated) %.2f MiB."
                     % tuple(mib(ma[k]) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                                  "temp_size_in_bytes", "alias_size_in_bytes")))
    if notes:
        out += ["- " + n for n in notes] + [""]
    return out


def gemm_section(rows, targets, peak=None):
    out = ["## Part 4: GEMM — novac sgemm vs numpy/OpenBLAS (`a @ b`), float32", "",
           "| M x N x K | novac ms | novac GFLOP/s | OpenBLAS ms | OpenBLAS GFLOP/s | novac / OpenBLAS | "
           ">= 0.95x | novac share of the sgemm limit | novac rel. error | numpy rel. error | novac runs / numpy runs | "
           "novac compile s |",
           "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        M, N, K = r["shape"]
        fl = 2.0 * M * N * K
        nv = fl / (r["ms"] * 1e6) if r.get("ms") else None
        bl = fl / (r["blas_ms"] * 1e6) if r.get("blas_ms") else None
        ratio = nv / bl if nv and bl else None
        tag = "%d x %d x %d" % (M, N, K)
        ok = met(ratio >= 0.95) if ratio is not None else "not measured"
        if ratio is None and "error" in r:
            ok = "not met"
        targets.append((4, "sgemm %s >= 0.95x OpenBLAS" % tag,
                        "%.2fx" % ratio if ratio is not None else (r.get("error") or r.get("blas_error") or "?"), ok))
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            tag, fmt(r.get("ms")) if "error" not in r else r["error"].replace("|", "/"), fmt(nv, "%.1f"),
            fmt(r.get("blas_ms")) if "blas_error" not in r else r["blas_error"], fmt(bl, "%.1f"),
            fmt(ratio, "%.2fx"), ok, "%.0f%%" % (100 * nv / peak) if nv and peak else "—", fmt(r.get("rel_err"), "%.1e"), fmt(r.get("blas_rel_err"), "%.1e"),
            "%s / %s" % (r.get("runs", "—"), r.get("blas_runs", "—")), fmt(r.get("compile_s"), "%.2f")))
    out += ["", "Relative error: ||C - C64||_F / ||C64||_F against the float64 product of the same float32 inputs "
            "(standard normal).", ""]
    return out


def report(bench, info, results, started, elapsed):
    a = bench.args
    lines = ["# novac CPU benchmark: training step and GEMM", ""]
    cmd = "python3 " + " ".join([os.path.relpath(os.path.abspath(__file__), ROOT)] + sys.argv[1:])
    pin = ("taskset -c %s" % ",".join(map(str, bench.cpus))) if bench.taskset else \
        "sched_setaffinity(%s)" % bench.cpus
    lines += [
        "- Date: %s (took %.1f min)" % (started, elapsed / 60),
        "- Command: `%s` (in %s; %s mode)" % (cmd, ROOT, "quick" if a.quick else "full"),
        "- Machine: %s%s" % (info["cpu"], ("; LLVM CPU `%s`" % info["llvm_cpu"]) if info.get("llvm_cpu") else ""),
        "- ISA: %s" % ("native (every system's best vector extension)" if a.isa == "native" else
                       "AVX2 (--isa avx2: every system told to use AVX2 and FMA only; novac `--cpu=x86-64-v3`, a "
                       "256-bit device model and NOVA_CONTRACT_ISA=avx2)"),
        "- Versions: %s; %s (build: %s)" % (info["novac"], info["versions"], os.path.relpath(a.build, ROOT)
                                            if os.path.abspath(a.build).startswith(ROOT) else a.build),
        "- Threads: %d for every system, every process pinned with `%s`: torch.set_num_threads(%d), "
        "XLA_FLAGS=\"%s\", OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=NOVA_NUM_THREADS=%d."
        % (a.threads, pin, a.threads, bench.env["XLA_FLAGS"], a.threads),
        "- Method: one process per system and workload; same weights (PyTorch's initial values: novac gets them "
        "through the ONNX initializers, or for the MLP a novarun --load checkpoint; JAX as arrays), same batch "
        "every step, float32, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01; written out for "
        "JAX). ms/step = median of per-step times after %d warm-up steps (PyTorch, torch.compile, XLA: "
        "perf_counter per step, XLA with block_until_ready; novac: `novarun --repeat N`, the median of N runs "
        "of the step in one process), steps chosen to fill ~%.1f s per system. torch.compile: model and "
        "optimizer step compiled, cold inductor cache; compile s = time of the warm-up steps beyond steady "
        "steps. XLA compile s = jit lower + compile. novac compile s = wall time of the novac command "
        "(pinned). Peak memory: novac's manifest (planned_peak_bytes); PyTorch: tensors alive before a "
        "steady step plus the highest point of its allocations during it (torch.profiler, "
        "profile_memory=True); XLA: compiled.memory_analysis() arguments + outputs + temp - aliased "
        "(params and optimizer state donated). GEMM: novac `novarun --repeat N` (median; N sized from the "
        "slowest GFLOP/s of the smaller shapes), numpy `a @ b` timed per call after 2 warm-up calls (median), "
        "~%.1f s each. novac runs fewer than %d times (down to 1) where %d runs would take over %d s."
        % (bench.mode["warmup"], bench.mode["budget"], bench.mode["gemm_budget"], bench.mode["novac_min"],
           bench.mode["novac_min"], bench.mode["cap_s"]),
        "- Temporary folder ($TMP): the exported model, step.so files, inputs and logs; removed at the end "
        "unless --keep.",
        "",
    ]
    targets = []
    body = []
    peak = (info.get("peak") or {}).get("gflops")
    lines.insert(-1, "- Machine limit: sgemm %s GFLOP/s on %d thread%s (numpy/OpenBLAS, the best of %s squares, "
                 "this run): each step's FLOP-limited floor is its FLOP (forward and backward, as "
                 "torch.utils.flop_counter counts them) at that rate." % (
                     fmt(peak, "%.1f"), a.threads, "" if a.threads == 1 else "s",
                     "/".join(str(n) for n in (info.get("peak") or {}).get("sizes", [])) or "?"))
    for wl in WORKLOADS:
        if wl in results:
            body += train_section(wl, results[wl], targets, peak)
    if "gemm" in results:
        body += gemm_section(results["gemm"], targets, peak)
    summary = ["## Targets", "", "| part | target | measured | |", "|---:|---|---:|---|"]
    for part, name, value, ok in targets:
        summary.append("| %d | %s | %s | %s |" % (part, name, value, ok))
    n_met = sum(1 for t in targets if t[3] == met(True))
    summary += ["", "%d of %d targets met." % (n_met, len(targets)), ""]
    return "\n".join(lines + summary + body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="parts 1, 2 and the 512 GEMM, fewer repeats (~2 min)")
    ap.add_argument("--threads", type=int, default=1, help="threads (and CPUs 0..N-1) for every system")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "cpu_results.md"), help="the markdown report")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="novac's build folder (bin/novac, "
                    "bin/novarun)")
    ap.add_argument("--only", default="", help="comma-separated subset of: mlp,gpt_block,gpt4,resnet18,"
                                                "mobilenet_v3_small,gemm")
    ap.add_argument("--systems", default="", help="training parts: comma-separated subset of "
                    "novac,eager,compile,xla (default all)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (models, steps, logs)")
    ap.add_argument("--isa", choices=("native", "avx2"), default="native",
                    help="avx2: the AVX2 code paths on an AVX-512 machine (novac: its AVX2 kernel, --cpu=x86-64-v3 "
                         "and a 256-bit device model; OpenBLAS: OPENBLAS_CORETYPE=Haswell; PyTorch: "
                         "ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2; XLA: --xla_cpu_max_isa=AVX2)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args.worker)
    args.build = os.path.abspath(args.build)
    if not importlib.util.find_spec("numpy"):
        sys.exit("bench_cpu.py needs numpy")
    bench = Bench(args)
    for tool in (bench.novac_bin, bench.novarun_bin):
        if not os.access(tool, os.X_OK):
            sys.exit("%s: not found; build novac first (make)" % tool)
    parts = [p for p in args.only.split(",") if p] or \
        (["mlp", "gpt_block", "gemm"] if args.quick else ["mlp", "gpt_block", "gpt4", "resnet18", "mobilenet_v3_small",
                                                          "gemm"])
    bad = [p for p in parts if p not in WORKLOADS and p != "gemm"]
    if bad:
        sys.exit("--only: unknown part %s" % ",".join(bad))
    started, t0 = time.strftime("%Y-%m-%d %H:%M:%S %Z"), time.perf_counter()
    info = machine_info(bench)
    results = {}
    try:
        bench.say("the machine's sgemm limit: numpy/OpenBLAS on squares")
        info["peak"] = bench.worker("numpy-peak", {"workload": "peak", "sizes": [1024, 2048],
                                                   "budget": bench.mode["gemm_budget"]})
        for p in parts:
            if p == "gemm":
                results["gemm"] = bench.gemm(GEMM_QUICK if args.quick else GEMM_FULL)
            else:
                results[p] = bench.train_workload(p)
                info.setdefault("llvm_cpu", results[p].get("novac", {}).get("llvm_cpu"))
    finally:
        if args.keep:
            bench.say("kept %s" % bench.tmp)
        else:
            shutil.rmtree(bench.tmp, ignore_errors=True)
    text = report(bench, info, results, started, time.perf_counter() - t0)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text + "\n")
    bench.say("report written to %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
