#!/usr/bin/env python3
"""novac checkpoints (novarun --save, safetensors) to and from PyTorch.

A training step compiled from an ONNX model names its parameters and buffers
as the model's initializers, which are PyTorch's state_dict names when the
exporter kept them (torch.onnx.export(..., do_constant_folding=False,
training=torch.onnx.TrainingMode.TRAINING); README "Checkpoints and
PyTorch").  Its optimizer state maps onto torch.optim's:

    novac                        torch.optim.AdamW / Adam        torch.optim.SGD
    NAME.adam_m                  state[i]["exp_avg"]
    NAME.adam_v                  state[i]["exp_avg_sq"]
    adam.step (one count)        state[i]["step"] (each param)
    NAME.momentum                                                state[i]["momentum_buffer"]

where i is the parameter's index in the optimizer's param_groups.  A
BatchNormalization's running statistics are its buffers under the same
names; num_batches_tracked, which novac does not keep, is set to the
checkpoint's step count.

As a library (numpy only, but for the torch.nn.Module helpers):

    to_torch_state(ckpt)          -> (model_state, optim_state_by_name, step)
    from_torch_state(model_state, optim_state_by_name, like) -> tensors for st_write
    load_into(module, optimizer, ckpt_path)      (torch)
    save_from(module, optimizer, like_path, out_path)   (torch)

From the command line (torch; MODULE is "package.module:factory", a callable
returning the torch.nn.Module, and the optimizer is rebuilt with the same
hyper-parameters the step was compiled with):

    torch_ckpt.py to-torch CKPT.st --module M:F [--optimizer adamw|sgd|momentum] -o OUT.pt
    torch_ckpt.py from-torch IN.pt --module M:F --like CKPT.st -o OUT.st
    torch_ckpt.py names CKPT.st        (what maps where; numpy only)
"""
import argparse
import importlib
import json
import struct
import sys

import numpy as np

ST_TYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64, "I32": np.int32,
            "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
ST_NAMES = {np.dtype(v): k for k, v in ST_TYPES.items()}
MOMENTS = {".adam_m": "exp_avg", ".adam_v": "exp_avg_sq", ".momentum": "momentum_buffer"}


class CheckpointError(Exception):
    pass


def st_read(path):
    """(dict name -> array, metadata) of a safetensors file (bf16 as its uint16 bits)."""
    blob = open(path, "rb").read()
    if len(blob) < 8:
        raise CheckpointError("%s: not a safetensors file" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    try:
        header = json.loads(blob[8:8 + n]) if n <= len(blob) - 8 else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise CheckpointError("%s: not a safetensors file (no JSON header of %d bytes)" % (path, n))
    data, out = blob[8 + n:], {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        try:
            dt = np.dtype(np.uint16 if e["dtype"] == "BF16" else ST_TYPES[e["dtype"]])
            shape = [int(d) for d in e["shape"]]
            b, end = (int(v) for v in e["data_offsets"])
            ok = all(d >= 0 for d in shape) and 0 <= b <= end <= len(data) and \
                end - b == int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError("%s: tensor '%s': a dtype, shape or data_offsets that do not fit the file"
                                  % (path, name))
        out[name] = np.frombuffer(data[b:end], dtype=dt).reshape(shape).copy()
    meta = header.get("__metadata__", {})
    return out, meta if isinstance(meta, dict) else {}


def st_write(path, tensors, metadata):
    header, parts, off = {"__metadata__": metadata}, [], 0
    for name, a in tensors.items():
        a = np.array(a, order="C")  # (ascontiguousarray would make a scalar 1-d)
        raw = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": ST_NAMES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        parts.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(parts))


def split(ckpt):
    """The checkpoint's params and buffers, its optimizer moments by param name, and its step count."""
    model, moments = {}, {}
    for name, a in ckpt.items():
        kind = next((k for k in MOMENTS if name.endswith(k)), None)
        if kind:
            moments.setdefault(name[:-len(kind)], {})[MOMENTS[kind]] = a
        elif name not in ("adam.step", "rng.step") and not name.startswith(("amp.", "accum.")) \
                and not name.endswith(".accum"):
            model[name] = a
    step = float(ckpt["adam.step"]) if "adam.step" in ckpt else None
    return model, moments, step


def to_torch_state(ckpt, metadata=None):
    """(model_state {name: array}, optimizer state {param name: {...}}, step count) of a novac checkpoint."""
    model, moments, adam_step = split(ckpt)
    try:
        steps = int((metadata or {}).get("step", 0) or 0)
    except (TypeError, ValueError):
        raise CheckpointError("the checkpoint's __metadata__ \"step\" is %r, not a number of steps"
                              % metadata.get("step"))
    optim = {}
    for name, m in moments.items():
        if name not in model:
            raise CheckpointError("optimizer state for '%s', which is no parameter of the checkpoint" % name)
        st = dict(m)
        if adam_step is not None:
            st["step"] = np.float32(adam_step)
        optim[name] = st
    return model, optim, steps


def from_torch_state(model_state, optim_state, like, step=None):
    """The tensors of a novac checkpoint shaped like LIKE (name -> array: every tensor of the step's), with
    the values of MODEL_STATE and OPTIM_STATE ({param name: {...}}) where they have them; the rest (a
    dropout's rng.step, the loss scale) keeps LIKE's values.  Every param and moment of LIKE must be given."""
    out = {}
    for name, a in like.items():
        kind = next((k for k in MOMENTS if name.endswith(k)), None)
        if kind:
            p = name[:-len(kind)]
            v = optim_state.get(p, {}).get(MOMENTS[kind])
            if v is None:
                raise CheckpointError("no optimizer state '%s' for '%s' (the step's '%s')" % (MOMENTS[kind], p, name))
        elif name == "adam.step":
            steps = {float(np.asarray(s["step"])) for s in optim_state.values() if "step" in s}
            if len(steps) > 1:
                raise CheckpointError("the parameters' AdamW step counts differ (%s); novac keeps one" % sorted(steps))
            v = np.float32(steps.pop()) if steps else a
        elif name in model_state:
            v = model_state[name]
        elif name in ("rng.step",) or name.startswith(("amp.", "accum.")) or name.endswith(".accum"):
            v = a
        else:
            raise CheckpointError("the step's '%s' %s has no value in the PyTorch state" % (name, list(a.shape)))
        v = np.asarray(v)
        if v.shape != a.shape:
            raise CheckpointError("'%s': PyTorch's is %s, the step's %s" % (name, list(v.shape), list(a.shape)))
        out[name] = v.astype(a.dtype)
    return out


def _module_names(module):
    """The module's parameter names and the names of its buffers, and which novac names they have."""
    return [n for n, _ in module.named_parameters()], [n for n, _ in module.named_buffers()]


def load_into(module, optimizer, ckpt_path, strict=True):
    """Loads the novac checkpoint CKPT_PATH into MODULE (and OPTIMIZER, an AdamW, Adam or SGD over
    module.parameters(), may be None).  Returns the checkpoint's step count."""
    import torch
    ckpt, meta = st_read(ckpt_path)
    model, optim, steps = to_torch_state(ckpt, meta)
    params, buffers = _module_names(module)
    state = module.state_dict()
    missing = [n for n in params if n not in model]
    if missing and strict:
        raise CheckpointError("%s holds no '%s' (the exporter renamed or folded it? export with "
                              "do_constant_folding=False)" % (ckpt_path, "', '".join(missing[:5])))
    new = {}
    for n, t in state.items():
        if n in model:
            a = model[n]
            if tuple(a.shape) != tuple(t.shape):
                raise CheckpointError("'%s': the checkpoint's is %s, the module's %s" % (n, list(a.shape),
                                                                                      list(t.shape)))
            new[n] = torch.from_numpy(np.array(a)).to(t.dtype)
        elif n.endswith("num_batches_tracked"):
            new[n] = torch.tensor(steps, dtype=t.dtype)
        elif strict and n in params:
            raise CheckpointError("%s holds no '%s'" % (ckpt_path, n))
    module.load_state_dict(new, strict=False)
    if optimizer is not None:
        sd = optimizer.state_dict()
        ids = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
        index = {}
        for n, p in module.named_parameters():
            if id(p) in ids:
                index[n] = ids[id(p)]
        sd["state"] = {}
        for n, st in optim.items():
            if n not in index:
                raise CheckpointError("optimizer state for '%s', which the optimizer does not train" % n)
            sd["state"][index[n]] = {k: torch.tensor(np.array(v)) for k, v in st.items()}
        optimizer.load_state_dict(sd)
    return steps


def save_from(module, optimizer, like_path, out_path):
    """Writes MODULE's (and OPTIMIZER's) state as a novac checkpoint for the step LIKE_PATH (a checkpoint
    of that step, novarun --save) was written by."""
    like, meta = st_read(like_path)
    model = {n: t.detach().cpu().numpy() for n, t in module.state_dict().items()}
    optim = {}
    if optimizer is not None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        names = {id(p): n for n, p in module.named_parameters()}
        for i, st in optimizer.state_dict()["state"].items():
            optim[names[id(params[i])]] = {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
                                           for k, v in st.items()}
    out = from_torch_state(model, optim, like)
    steps = next((int(float(s["step"])) for s in optim.values() if "step" in s), int(meta.get("step", 0) or 0))
    st_write(out_path, out, {"format": "novac", "graph_hash": meta.get("graph_hash", ""), "step": str(steps)})


def _factory(spec):
    mod, _, fn = spec.partition(":")
    if not fn:
        raise CheckpointError("--module takes package.module:factory, got '%s'" % spec)
    sys.path.insert(0, ".")
    return getattr(importlib.import_module(mod), fn)()


def _optimizer(kind, module, lr):
    import torch
    if kind == "adamw":
        return torch.optim.AdamW(module.parameters(), lr=lr)
    if kind == "momentum":
        return torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    return torch.optim.SGD(module.parameters(), lr=lr) if kind == "sgd" else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("to-torch", help="a novac checkpoint into a torch.save file {'model', 'optimizer'}")
    a.add_argument("ckpt")
    a.add_argument("--module", required=True)
    a.add_argument("--optimizer", choices=("adamw", "sgd", "momentum", "none"), default="adamw")
    a.add_argument("--lr", type=float, default=1e-3)
    a.add_argument("-o", "--output", required=True)
    b = sub.add_parser("from-torch", help="a torch.save file {'model', 'optimizer'} into a novac checkpoint")
    b.add_argument("pt")
    b.add_argument("--module", required=True)
    b.add_argument("--optimizer", choices=("adamw", "sgd", "momentum", "none"), default="adamw")
    b.add_argument("--like", required=True, help="a checkpoint of the step (novarun --save)")
    b.add_argument("-o", "--output", required=True)
    c = sub.add_parser("names", help="what a checkpoint maps to in PyTorch's terms")
    c.add_argument("ckpt")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "names":
            ckpt, meta = st_read(args.ckpt)
            model, optim, steps = to_torch_state(ckpt, meta)
            for n, v in model.items():
                print("%-40s %s%s" % (n, list(v.shape), "  + " + ", ".join(sorted(optim[n])) if n in optim else ""))
            print("steps: %d" % steps)
            return 0
        import torch
        module = _factory(args.module)
        opt = _optimizer(args.optimizer, module, getattr(args, "lr", 1e-3))
        if args.cmd == "to-torch":
            load_into(module, opt, args.ckpt)
            torch.save({"model": module.state_dict(), "optimizer": opt.state_dict() if opt else None}, args.output)
        else:
            obj = torch.load(args.pt, weights_only=False)
            module.load_state_dict(obj["model"])
            if opt is not None and obj.get("optimizer"):
                opt.load_state_dict(obj["optimizer"])
            save_from(module, opt, args.like, args.output)
    except (CheckpointError, OSError) as e:
        print("torch_ckpt.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
