#!/usr/bin/env python3
"""Compile time of one GPT training step (forward, backward, SGD update) in
novac, torch.compile (inductor, CPU) and JAX/XLA (jax.jit), side by side in
one run, for the same model: the GPT of bench_compile.py (pre-norm blocks,
causal attention, GELU MLP, untied head, cross-entropy), by default at
GPT-2 small's size (12 layers, d 768, 12 heads, T 256, vocab 50257,
batch 4: 162M parameters).

    python3 bench/bench_compile_peers.py [--layers 12] [--d 768] [--heads 12] [--T 256]
        [--vocab 50257] [--batch 4] [--systems novac,compile,xla] [--build DIR]

novac: `novac model.nova --train` from start to a written step.so (wall,
CPU time of novac and its code generators, peak RSS).  torch.compile: the
first compiled training step minus one eager step (what compiling adds),
and the process's peak RSS growth over the model's allocation.  JAX:
jax.jit(...).lower(...).compile() of the step (wall), the same RSS rule.
Each system runs in a process of its own, torch.compile with an empty
kernel cache.  Prints a markdown table."""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_compile(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    L, d, H, T, V, B = cfg["layers"], cfg["d"], cfg["heads"], cfg["T"], cfg["vocab"], cfg["batch"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.fc = nn.Linear(d, 4 * d, bias=False)
            self.out = nn.Linear(4 * d, d, bias=False)

        def forward(self, h, mask):
            q, k, v = self.qkv(self.ln1(h)).split(d, dim=2)
            q, k, v = (t.reshape(B, T, H, d // H).transpose(1, 2) for t in (q, k, v))
            att = torch.softmax(q @ k.transpose(2, 3) * (d // H) ** -0.5 + mask, dim=-1)
            r = h + self.proj((att @ v).transpose(1, 2).reshape(B, T, d))
            return r + self.out(F.gelu(self.fc(self.ln2(r))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Parameter(torch.randn(V, d) * 0.02), nn.Parameter(torch.randn(T, d) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(d)
            self.head = nn.Linear(d, V, bias=False)
            self.register_buffer("mask", torch.triu(torch.full((T, T), -1e9), 1))

        def forward(self, tokens, targets):
            h = self.wte[tokens] + self.wpe
            for b in self.blocks:
                h = b(h, self.mask)
            return F.cross_entropy(self.head(self.lnf(h)).reshape(B * T, V), targets.reshape(B * T))

    model = GPT()
    rss0 = rss_mib()
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(m):
        opt.zero_grad(set_to_none=True)
        loss = m(tokens, targets)
        loss.backward()
        opt.step()
        return loss

    step(model)  # warm the eager path (allocator, threads)
    t0 = time.perf_counter()
    step(model)
    eager = time.perf_counter() - t0
    cm = torch.compile(model)
    t0 = time.perf_counter()
    step(cm)
    first = time.perf_counter() - t0
    return {"compile_s": first - eager, "rss_growth_mib": rss_mib() - rss0, "version": torch.__version__}


def worker_xla(cfg):
    import jax
    import jax.numpy as jnp
    L, d, H, T, V, B = cfg["layers"], cfg["d"], cfg["heads"], cfg["T"], cfg["vocab"], cfg["batch"]
    key = jax.random.PRNGKey(0)

    def normal(shape, s=0.02):
        nonlocal key
        key, k = jax.random.split(key)
        return jax.random.normal(k, shape, jnp.float32) * s

    p = {"wte": normal((V, d)), "wpe": normal((T, d)), "lnf_g": jnp.ones(d), "lnf_b": jnp.zeros(d),
         "head": normal((d, V))}
    for i in range(L):
        p.update({"ln1_g%d" % i: jnp.ones(d), "ln1_b%d" % i: jnp.zeros(d), "ln2_g%d" % i: jnp.ones(d),
                  "ln2_b%d" % i: jnp.zeros(d), "qkv%d" % i: normal((d, 3 * d)), "proj%d" % i: normal((d, d)),
                  "fc%d" % i: normal((d, 4 * d)), "out%d" % i: normal((4 * d, d))})
    mask = jnp.triu(jnp.full((T, T), -1e9), 1)

    def ln(x, g, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def loss(p, tokens, targets):
        h = p["wte"][tokens] + p["wpe"]
        for i in range(L):
            q, k, v = jnp.split(ln(h, p["ln1_g%d" % i], p["ln1_b%d" % i]) @ p["qkv%d" % i], 3, axis=-1)
            q, k, v = (t.reshape(B, T, H, d // H).transpose(0, 2, 1, 3) for t in (q, k, v))
            att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) * (d // H) ** -0.5 + mask, axis=-1)
            r = h + (att @ v).transpose(0, 2, 1, 3).reshape(B, T, d) @ p["proj%d" % i]
            h = r + jax.nn.gelu(ln(r, p["ln2_g%d" % i], p["ln2_b%d" % i]) @ p["fc%d" % i],
                                approximate=False) @ p["out%d" % i]
        logits = ln(h, p["lnf_g"], p["lnf_b"]) @ p["head"]
        lse = jax.nn.logsumexp(logits, axis=-1)
        return jnp.mean(lse - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0])

    def train_step(p, tokens, targets):
        lv, g = jax.value_and_grad(loss)(p, tokens, targets)
        return lv, jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g)

    rss0 = rss_mib()
    tokens = jnp.zeros((B, T), jnp.int32)
    t0 = time.perf_counter()
    jax.jit(train_step, donate_argnums=0).lower(p, tokens, tokens).compile()
    return {"compile_s": time.perf_counter() - t0, "rss_growth_mib": rss_mib() - rss0, "version": jax.__version__}


def run_novac(cfg, build):
    import bench_compile
    text, ext = bench_compile.gpt(cfg["layers"], d=cfg["d"], heads=cfg["heads"], T=cfg["T"], vocab=cfg["vocab"],
                                  batch=cfg["batch"])
    with tempfile.TemporaryDirectory(prefix="nova-peers-") as tmp:
        wall, cpu, rss, err = bench_compile.compile_once(os.path.join(build, "bin", "novac"), text, ext, True, 1800,
                                                         tmp)
    if err:
        return {"error": err}
    return {"compile_s": wall, "cpu_s": cpu, "rss_mib": rss}


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        job = json.loads(sys.argv[2])
        fn = {"compile": worker_compile, "xla": worker_xla}[job["system"]]
        try:
            print("RESULT " + json.dumps(fn(job["cfg"])))
        except ImportError as e:
            print("RESULT " + json.dumps({"error": "not installed: %s" % e}))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in (("layers", 12), ("d", 768), ("heads", 12), ("T", 256), ("vocab", 50257), ("batch", 4)):
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--systems", default="novac,compile,xla")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    cfg = {k: getattr(a, k) for k in ("layers", "d", "heads", "T", "vocab", "batch")}
    nparams = cfg["vocab"] * cfg["d"] * 2 + cfg["T"] * cfg["d"] + cfg["layers"] * (12 * cfg["d"] ** 2 + 4 * cfg["d"])
    res = {}
    for s in a.systems.split(","):
        if s == "novac":
            res[s] = run_novac(cfg, a.build)
        else:
            with tempfile.TemporaryDirectory(prefix="nova-peers-cache-") as cache:
                # a cold start for everyone: no kernels cached by an earlier run
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=cache)
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker",
                                    json.dumps({"system": s, "cfg": cfg})], capture_output=True, text=True, env=env)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            res[s] = json.loads(line[-1][7:]) if line else {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:120]}
        print("%s: %s" % (s, res[s]), file=sys.stderr, flush=True)
    print("machine: %s, %d cores (%s); date %s; command: %s" % (platform.machine(), os.cpu_count(), cpu_name(),
                                                              time.strftime("%Y-%m-%d"), " ".join(sys.argv)))
    print("model: GPT, %d layers, d %d, %d heads, T %d, vocab %d, batch %d (%.0fM parameters), SGD training step"
          % (cfg["layers"], cfg["d"], cfg["heads"], cfg["T"], cfg["vocab"], cfg["batch"], nparams / 1e6))
    print("| system | compile time | memory | vs novac |")
    print("|---|---:|---|---:|")
    base = res.get("novac", {}).get("compile_s")
    names = {"novac": "novac", "compile": "torch.compile (inductor)", "xla": "JAX/XLA (jax.jit)"}
    for s, r in res.items():
        if "error" in r:
            print("| %s | %s | | |" % (names[s], r["error"]))
            continue
        mem = ("%.0f MiB peak RSS" % r["rss_mib"]) if "rss_mib" in r else ("+%.0f MiB RSS over the model" %
                                                                         r["rss_growth_mib"])
        extra = (" (%.1f s CPU)" % r["cpu_s"]) if "cpu_s" in r else ""
        ratio = "%.2fx" % (r["compile_s"] / base) if base and s != "novac" else ""
        print("| %s%s | %.1f s%s | %s | %s |" % (names[s], " " + r["version"] if "version" in r else "",
                                                   r["compile_s"], extra, mem, ratio))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


if __name__ == "__main__":
    main()
