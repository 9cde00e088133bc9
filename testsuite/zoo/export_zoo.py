#!/usr/bin/env python3
"""Export novac's model zoo with PyTorch: small configurations of real
architectures (torchvision, Hugging Face transformers), each wrapped so that
the graph returns (logits, loss), with the reference data of one training
step computed by PyTorch.

    python3 testsuite/zoo/export_zoo.py [--out DIR] [MODEL ...]

Needs torch, torchvision, transformers, onnxscript (the dynamo exporter) and
onnxruntime; no pretrained weights: every model is built from a config
written here and initialized randomly from fixed seeds.  Running it twice
gives the same files.

Each model is exported twice, as case NAME.EXPORTER:

  ts       torch.onnx.export(dynamo=False, opset_version=17): TorchScript.
           Eval-mode models with training=TrainingMode.PRESERVE (the model
           is in eval mode, so the graph is inference; PRESERVE rather than
           EVAL because EVAL folds BatchNorm into the preceding Conv, which
           changes the parameters training sees), constant folding on.
  dynamo   torch.onnx.export(dynamo=True, opset_version=18), with the
           default graph optimization except onnxscript's BatchNorm-into-Conv
           fusion rules (same reason).

The Dropout / BatchNorm model (dropbn) is exported in eval mode (dropbn_eval)
and in training mode (dropbn_train: training=TrainingMode.TRAINING for ts,
the module in train mode for dynamo).

For a case that exported, DIR/CASE/ holds:

  model.onnx
  test_data_set_0/input_K.pb     graph inputs, in graph-input order
  test_data_set_0/output_0.pb    logits (PyTorch, float32)
  test_data_set_0/output_1.pb    loss
  test_data_set_0/grad.INIT.pb   d loss / d INIT for each initializer INIT
                                 that holds a trained PyTorch parameter, in
                                 the initializer's layout
  test_data_set_0/sgd_step/param.INIT.pb
                                 INIT after one torch.optim.SGD(lr=0.1) step
  test_data_set_0/running_stats/param.INIT.pb   (dropbn_train only)
                                 BatchNorm running statistics after the step
  reference.json                 how it was made, the initializer classes
                                 (parameters with layout, frozen parameters,
                                 buffers, exporter constants), the
                                 onnxruntime check, the train-mode extras

and DIR/zoo.json lists every case (exported or not, with the reason).
"""
import argparse
import collections
import copy
import hashlib
import io
import json
import math
import os
import shutil
import sys
import traceback
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH = 2
SEQ = 8
SGD_LR = 0.1
TRAJECTORY_STEPS = 3
MASK_SAMPLES = 256
OPSETS = {"ts": 17, "dynamo": 18}
ORT_TOL = 1e-5


# ---------------------------------------------------------------- models

class Classifier(nn.Module):
    """An image / sequence classifier returning (logits, cross-entropy loss)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, labels):
        logits = self.net(x)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class SmallResNet18(nn.Module):
    """torchvision's ResNet with BasicBlock [2, 2, 2, 2], widths 8-16-32-64
    (torchvision.models.ResNet fixes 64-128-256-512, so this builds the same
    module tree with its _make_layer and forward)."""

    def __init__(self, widths=(8, 16, 32, 64), num_classes=10):
        super().__init__()
        from torchvision.models.resnet import BasicBlock, ResNet
        self._ResNet = ResNet
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = widths[0]
        self.dilation = 1
        self.groups = 1
        self.base_width = 64
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = ResNet._make_layer(self, BasicBlock, widths[0], 2)
        self.layer2 = ResNet._make_layer(self, BasicBlock, widths[1], 2, stride=2)
        self.layer3 = ResNet._make_layer(self, BasicBlock, widths[2], 2, stride=2)
        self.layer4 = ResNet._make_layer(self, BasicBlock, widths[3], 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3] * BasicBlock.expansion, num_classes)

    def forward(self, x):
        return self._ResNet._forward_impl(self, x)


class HFLM(nn.Module):
    """A Hugging Face model returning (logits, cross entropy of logits vs labels)."""

    def __init__(self, model, ones_mask=False):
        super().__init__()
        import inspect
        self.m = model
        self.ones_mask = ones_mask
        self.kw = {"return_dict": True}
        if "use_cache" in inspect.signature(model.forward).parameters:
            self.kw["use_cache"] = False

    def forward(self, input_ids, labels):
        kw = dict(self.kw)
        if self.ones_mask:
            # no padding; without a mask transformers 5 looks for packed sequences in the
            # position ids with torch.diff, which the TorchScript exporter cannot export
            kw["attention_mask"] = torch.ones_like(input_ids)
        logits = self.m(input_ids=input_ids, **kw).logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class HFSeq2Seq(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, decoder_input_ids, labels):
        logits = self.m(input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False,
                        return_dict=True).logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class WhisperFrames(nn.Module):
    """Whisper encoder + a per-frame classifier head."""

    def __init__(self, encoder, d_model, classes):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(d_model, classes)

    def forward(self, input_features, labels):
        h = self.encoder(input_features=input_features, return_dict=True).last_hidden_state
        logits = self.head(h)
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class DropBN(nn.Module):
    """Conv-BN-ReLU x2, global average pool, Dropout(0.25), Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(16, 10)

    def forward(self, x, labels):
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)))
        h = self.drop(h.mean(dim=(2, 3)))
        logits = self.fc(h)
        return logits, F.cross_entropy(logits, labels)


def image_inputs(g, classes=10, size=32):
    return ("x", "labels"), (torch.randn(BATCH, 3, size, size, generator=g),
                             torch.randint(0, classes, (BATCH,), generator=g))


def lm_inputs(g, vocab):
    return ("input_ids", "labels"), (torch.randint(0, vocab, (BATCH, SEQ), generator=g),
                                     torch.randint(0, vocab, (BATCH, SEQ), generator=g))


def make_resnet18(g):
    cfg = {"block": "BasicBlock", "layers": [2, 2, 2, 2], "widths": [8, 16, 32, 64],
           "num_classes": 10, "image": [3, 32, 32]}
    return Classifier(SmallResNet18()), cfg, image_inputs(g)


def make_mobilenet_v3_small(g):
    from torchvision.models import mobilenet_v3_small
    cfg = {"width_mult": 0.25, "num_classes": 10, "image": [3, 32, 32]}
    return Classifier(mobilenet_v3_small(width_mult=0.25, num_classes=10)), cfg, image_inputs(g)


def make_vit(g):
    from torchvision.models.vision_transformer import VisionTransformer
    cfg = dict(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
               num_classes=10)
    return Classifier(VisionTransformer(**cfg)), cfg, image_inputs(g)


def hf_config(cls, **kw):
    c = cls(**kw)
    c._attn_implementation = "eager"
    return c


def make_gpt2(g):
    from transformers import GPT2Config, GPT2LMHeadModel
    kw = dict(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=64,
              bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, use_cache=False,
              attn_implementation="eager")
    m = HFLM(GPT2LMHeadModel(hf_config(GPT2Config, **kw)), ones_mask=True)
    kw["attention_mask"] = "torch.ones_like(input_ids), made inside the wrapper"
    return m, kw, lm_inputs(g, 64)


def make_bert_mlm(g):
    from transformers import BertConfig, BertForMaskedLM
    kw = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, max_position_embeddings=16, type_vocab_size=2,
              pad_token_id=0, tie_word_embeddings=False, attn_implementation="eager")
    ids = torch.randint(5, 64, (BATCH, SEQ), generator=g)
    labels = torch.full((BATCH, SEQ), -100, dtype=torch.long)
    masked = torch.rand(BATCH, SEQ, generator=g) < 0.25
    masked[:, 1] = True                                  # at least one per row
    labels[masked] = ids[masked]
    ids = ids.masked_fill(masked, 4)                     # [MASK] = 4
    kw["mlm"] = "25% of positions (and position 1) replaced by token 4; labels -100 elsewhere"
    cfg = {k: v for k, v in kw.items() if k != "mlm"}
    return HFLM(BertForMaskedLM(hf_config(BertConfig, **cfg))), kw, (("input_ids", "labels"),
                                                                      (ids, labels))


def make_llama(g):
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
              rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, pad_token_id=None,
              tie_word_embeddings=False, use_cache=False, attn_implementation="eager")
    m = HFLM(LlamaForCausalLM(hf_config(LlamaConfig, **kw)), ones_mask=True)
    kw["attention_mask"] = "torch.ones_like(input_ids), made inside the wrapper"
    return m, kw, lm_inputs(g, 64)


def make_t5(g):
    from transformers import T5Config, T5ForConditionalGeneration
    kw = dict(vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
              num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
              dropout_rate=0.0, feed_forward_proj="relu", pad_token_id=0, eos_token_id=1,
              decoder_start_token_id=0, tie_word_embeddings=False, use_cache=False,
              attn_implementation="eager")
    src = torch.randint(2, 64, (BATCH, SEQ), generator=g)
    labels = torch.randint(2, 64, (BATCH, SEQ), generator=g)
    dec = torch.cat([torch.zeros(BATCH, 1, dtype=torch.long), labels[:, :-1]], dim=1)
    kw["decoder_input_ids"] = "labels shifted right, decoder_start_token_id 0 first"
    cfg = {k: v for k, v in kw.items() if k != "decoder_input_ids"}
    t5 = T5ForConditionalGeneration(hf_config(T5Config, **cfg))
    if t5.lm_head.weight is t5.shared.weight:
        # transformers 5 ties lm_head to the embedding even with tie_word_embeddings=False;
        # the exporters would store the tied table twice (as is and transposed), which
        # novac would train as two tensors: untied here.  The encoder and the decoder
        # still share m.shared.weight (one initializer, two Gathers).
        t5.lm_head.weight = nn.Parameter(t5.shared.weight.detach().clone())
        kw["lm_head"] = "untied from the shared embedding (a parameter of its own)"
    return HFSeq2Seq(t5), kw, \
        (("input_ids", "decoder_input_ids", "labels"), (src, dec, labels))


def make_whisper_encoder(g):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    kw = dict(vocab_size=64, num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=2,
              encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
              max_source_positions=8, max_target_positions=16, dropout=0.0,
              attn_implementation="eager")
    enc = WhisperEncoder(hf_config(WhisperConfig, **kw))
    kw["head"] = "Linear(32, 10) on every encoder frame"
    x = torch.randn(BATCH, 8, 16, generator=g)           # [batch, mel bins, 2 * positions]
    y = torch.randint(0, 10, (BATCH, 8), generator=g)
    return WhisperFrames(enc, 32, 10), kw, (("input_features", "labels"), (x, y))


def make_dropbn(g):
    cfg = {"layers": "Conv(3,8,3)-BN-ReLU-Conv(8,16,3)-BN-ReLU-mean-Dropout(0.25)-Linear(16,10)",
           "image": [3, 8, 8]}
    return DropBN(), cfg, image_inputs(g, size=8)


# name, builder, seed, modes
MODELS = [
    ("resnet18", make_resnet18, 0, ["eval"]),
    ("mobilenet_v3_small", make_mobilenet_v3_small, 1, ["eval"]),
    ("vit", make_vit, 2, ["eval"]),
    ("gpt2", make_gpt2, 3, ["eval"]),
    ("bert_mlm", make_bert_mlm, 4, ["eval"]),
    ("llama", make_llama, 5, ["eval"]),
    ("t5", make_t5, 6, ["eval"]),
    ("whisper_encoder", make_whisper_encoder, 7, ["eval"]),
    ("dropbn", make_dropbn, 8, ["eval", "train"]),
]


# ---------------------------------------------------------------- helpers

def write_pb(path, arr, name):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(np.array(arr, order="C", copy=True), name).SerializeToString())


def npy(t):
    return t.detach().cpu().numpy()


def perturb(model, seed):
    """Moves every parameter a little away from its initialization and
    BatchNorm's running statistics away from 0 / 1: exporters merge
    initializers with equal values (all LayerNorm weights are 1, all biases
    0), which would tie parameters that PyTorch trains separately."""
    g = torch.Generator().manual_seed(10000 + seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.add_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.mul_(1 + 0.2 * torch.rand(m.running_var.shape, generator=g))


FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16}


def used_names(graph):
    names = set()
    for n in graph.node:
        names.update(n.input)
        for a in n.attribute:
            for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                names.update(used_names(sg))
    return names


def classify_initializers(model, onnx_model):
    """Maps each torch parameter and buffer to the initializers holding it
    (by name, else by value, possibly transposed) and lists the rest."""
    inits = collections.OrderedDict((i.name, (i, numpy_helper.to_array(i))) for i in onnx_model.graph.initializer)
    used = used_names(onnx_model.graph)
    taken = {}

    def find(tname, v):
        hits = []
        if tname in inits and inits[tname][1].shape == v.shape and np.array_equal(inits[tname][1], v):
            hits.append((tname, "same"))
        for iname, (_, a) in inits.items():
            if iname == tname or a.dtype != v.dtype or a.size != v.size or v.size == 0:
                continue
            if a.shape == v.shape and np.array_equal(a, v):
                hits.append((iname, "same"))
            elif v.ndim == 2 and a.shape == v.T.shape and np.array_equal(a, v.T):
                hits.append((iname, "transposed"))
        return hits

    params, frozen, buffers = [], [], []
    for pname, p in model.named_parameters():
        v = npy(p)
        hits = [h for h in find(pname, v) if h[0] not in taken]
        entry = {"torch": pname, "shape": list(p.shape)}
        if not hits:
            entry["initializer"] = None
            entry["note"] = "no initializer holds this parameter (the exporter folded or inlined it)"
        else:
            entry["initializer"], entry["layout"] = hits[0]
            entry["initializer_shape"] = list(inits[hits[0][0]][1].shape)
            if len(hits) > 1:
                entry["copies"] = [{"initializer": i, "layout": lay} for i, lay in hits[1:]]
                entry["note"] = ("the exporter stored this parameter %d times; novac trains each copy "
                                 "separately, so no reference gradient is given" % len(hits))
            for i, _ in hits:
                taken[i] = pname
        (params if p.requires_grad else frozen).append(entry)
    for bname, b in model.named_buffers():
        v = npy(b)
        hits = [h for h in find(bname, v) if h[0] not in taken]
        entry = {"torch": bname, "shape": list(b.shape), "dtype": str(v.dtype),
                 "initializers": [i for i, _ in hits]}
        if not hits:
            entry["note"] = "no initializer holds this buffer (folded into constants or unused)"
        for i, _ in hits:
            taken[i] = bname
        buffers.append(entry)
    constants = []
    for iname, (proto, a) in inits.items():
        if iname in taken:
            continue
        constants.append({"initializer": iname, "shape": list(a.shape), "dtype": str(a.dtype),
                          "used": iname in used})
    # what novac would train unless told: floating-point initializers that
    # nodes use; the ones that are not trained torch parameters get --freeze
    freeze = []
    for iname, (proto, a) in inits.items():
        if proto.data_type not in FLOAT_TYPES or iname not in used:
            continue
        owner = taken.get(iname)
        if owner is None or owner not in dict(model.named_parameters()) or \
                not dict(model.named_parameters())[owner].requires_grad:
            freeze.append(iname)
    return params, frozen, buffers, constants, freeze


def in_layout(t, layout):
    a = npy(t).astype(np.float32)
    return np.ascontiguousarray(a.T) if layout == "transposed" else a


def op_counts(onnx_model):
    c = collections.Counter()

    def walk(g):
        for n in g.node:
            c[(n.domain or "") + ("::" if n.domain else "") + n.op_type] += 1
            for a in n.attribute:
                for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sg)
    walk(onnx_model.graph)
    return dict(sorted(c.items()))


def short(e, n=300):
    s = ("%s: %s" % (type(e).__name__, e)).strip()
    lines = [l for l in s.splitlines() if l.strip()]
    s = " ".join(lines[:3])
    return s if len(s) <= n else s[:n - 3] + "..."


def no_bn_fusion():
    """onnxscript's default rewrite rules without the BatchNorm-into-Conv
    fusion (an inference rewrite: it changes Conv's weights)."""
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import _fuse_batchnorm
    fuse = set(id(r) for r in _fuse_batchnorm.rules)
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in rewriter._DEFAULT_REWRITE_RULES if id(r) not in fuse)


def export(model, exporter, mode, input_names, inputs):
    buf = io.BytesIO()
    kw = dict(input_names=list(input_names), output_names=["logits", "loss"], export_params=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "ts":
            train = torch.onnx.TrainingMode.TRAINING if mode == "train" else torch.onnx.TrainingMode.PRESERVE
            torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=OPSETS["ts"], training=train,
                              do_constant_folding=True, keep_initializers_as_inputs=False, **kw)
            return buf.getvalue()
        prog = torch.onnx.export(model, inputs, dynamo=True, opset_version=OPSETS["dynamo"],
                                 external_data=False, verbose=False, report=False, optimize=False, **kw)
        # the exporter's default optimization (onnxscript.optimizer.optimize_ir), except
        # that a node reading a parameter is never folded into a constant (it folds
        # e.g. Gather(position table, static positions), making the table untrainable)
        import onnx_ir as ir
        from onnxscript.optimizer import optimize_ir
        pnames = set(n for n, _ in model.named_parameters(remove_duplicate=False))

        def should_fold(node):
            if any(v is not None and v.name in pnames and v.is_initializer() for v in node.inputs):
                return False
            return None
        optimize_ir(prog.model, should_fold=should_fold)
        proto = ir.serde.serialize_model(prog.model)
        # node metadata: the exporter's stack traces (paths on the exporting machine),
        # 70% of the file; no meaning for the graph
        for n in proto.graph.node:
            del n.metadata_props[:]
        return proto.SerializeToString()


def ort_run(data, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ---------------------------------------------------------------- one case

def export_case(name, make, seed, mode, exporter, outdir):
    case = "%s%s.%s" % (name, "" if len(dict((m[0], m[3]) for m in MODELS)[name]) == 1 else "_" + mode,
                        exporter)
    info = {"case": case, "model": name, "mode": mode, "exporter": exporter, "opset": OPSETS[exporter]}
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1000 + seed)
    model, cfg, (input_names, inputs) = make(g)
    model.float()
    perturb(model, seed)
    model.train(mode == "train")
    info["config"] = cfg
    init_state = copy.deepcopy(model.state_dict())

    mdir = os.path.join(outdir, case)
    if os.path.isdir(mdir):
        shutil.rmtree(mdir)
    try:
        torch.manual_seed(seed)
        # with gradients enabled, as for training (under no_grad nn.MultiheadAttention takes
        # its inference fast path, aten::_native_multi_head_attention, which TorchScript cannot export)
        data = export(copy.deepcopy(model), exporter, mode, input_names, inputs)
        if not data:
            raise RuntimeError("the exporter returned no model")
        onnx_model = onnx.load_from_string(data)
    except Exception as e:
        info["export"] = "failed"
        info["error"] = short(e)
        info["traceback_tail"] = traceback.format_exc().strip().splitlines()[-1][:300]
        return info
    # the TorchScript exporter runs the model to trace it, in train mode
    # updating BatchNorm's statistics before it stores them: the reference
    # starts from the values in the file
    inits = {i.name: numpy_helper.to_array(i) for i in onnx_model.graph.initializer}
    with torch.no_grad():
        for bname, b in model.named_buffers():
            if bname in inits and inits[bname].shape == tuple(b.shape) and b.is_floating_point() \
                    and not np.array_equal(inits[bname], npy(b)):
                b.copy_(torch.from_numpy(inits[bname].copy()))
                info.setdefault("buffers_from_file", []).append(bname)
    init_state = copy.deepcopy(model.state_dict())
    info["export"] = "ok"
    try:
        onnx.checker.check_model(onnx_model, full_check=True)
        info["onnx_checker"] = "ok"
    except Exception as e:
        info["onnx_checker"] = short(e)

    graph_inputs = [i.name for i in onnx_model.graph.input
                    if i.name not in {x.name for x in onnx_model.graph.initializer}]
    byname = dict(zip(input_names, inputs))
    missing = [n for n in graph_inputs if n not in byname]
    if missing:
        info["export"] = "failed"
        info["error"] = "graph inputs %s are not model inputs" % missing
        return info
    outputs = [o.name for o in onnx_model.graph.output]
    if outputs[:2] != ["logits", "loss"]:
        info["note_outputs"] = "graph outputs %s" % outputs

    os.makedirs(os.path.join(mdir, "test_data_set_0", "sgd_step"))
    tdir = os.path.join(mdir, "test_data_set_0")
    with open(os.path.join(mdir, "model.onnx"), "wb") as f:
        f.write(data)

    params, frozen, buffers, constants, freeze = classify_initializers(model, onnx_model)
    named = dict(model.named_parameters())

    # forward + backward (dropout masks drawn from a fixed seed)
    model.zero_grad()
    torch.manual_seed(seed)
    logits, loss = model(*inputs)
    loss.backward()
    for k, n in enumerate(graph_inputs):
        write_pb(os.path.join(tdir, "input_%d.pb" % k), npy(byname[n]), n)
    write_pb(os.path.join(tdir, "output_0.pb"), npy(logits).astype(np.float32), "logits")
    write_pb(os.path.join(tdir, "output_1.pb"), npy(loss).astype(np.float32), "loss")
    for e in params:
        if named[e["torch"]].grad is None:
            e["note"] = "the forward does not use this parameter (PyTorch computes no gradient)"
            e["unused"] = True
    for e in params:
        if e["initializer"] and "copies" not in e and not e.get("unused"):
            write_pb(os.path.join(tdir, "grad.%s.pb" % e["initializer"].replace("/", "_")),
                     in_layout(named[e["torch"]].grad, e["layout"]), e["initializer"])
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=SGD_LR)
    opt.step()
    for e in params:
        if e["initializer"] and "copies" not in e and not e.get("unused"):
            write_pb(os.path.join(tdir, "sgd_step", "param.%s.pb" % e["initializer"].replace("/", "_")),
                     in_layout(named[e["torch"]], e["layout"]), e["initializer"])
    train_extra = None
    if mode == "train":
        rdir = os.path.join(tdir, "running_stats")
        os.makedirs(rdir)
        sd = model.state_dict()
        stats = []
        for b in buffers:
            if b["torch"].endswith(("running_mean", "running_var")):
                for i in b["initializers"]:
                    write_pb(os.path.join(rdir, "param.%s.pb" % i.replace("/", "_")), npy(sd[b["torch"]]), i)
                    stats.append({"torch": b["torch"], "initializer": i})
        # 3 SGD steps with dropout on, same batch
        model.load_state_dict(init_state)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=SGD_LR)
        torch.manual_seed(seed)
        traj = []
        for _ in range(TRAJECTORY_STEPS):
            opt.zero_grad()
            _, l = model(*inputs)
            traj.append(float(l.item()))
            l.backward()
            opt.step()
        # the spread of the step-1 loss over dropout masks (the graph draws its own)
        samples = []
        for s in range(MASK_SAMPLES):
            model.load_state_dict(init_state)
            torch.manual_seed(100000 + s)
            with torch.no_grad():
                samples.append(float(model(*inputs)[1].item()))
        model.load_state_dict(init_state)
        model.eval()
        with torch.no_grad():
            no_drop = float(model(*inputs)[1].item())   # eval: running stats, no dropout
        model.train()
        train_extra = {
            "note": "loss, gradients and SGD parameters in test_data_set_0 are for PyTorch's dropout mask "
                    "(torch.manual_seed(%d) before the forward); the exported graph draws its own mask, so "
                    "only mask-independent quantities compare exactly: the BatchNorm running statistics "
                    "after the step (running_stats/; BatchNorm precedes Dropout)" % seed,
            "running_stats_after_step": stats,
            "bn_momentum": 0.1,
            "trajectory": {"optimizer": "torch.optim.SGD", "lr": SGD_LR, "steps": TRAJECTORY_STEPS,
                           "note": "losses[i] is the loss before update i, dropout on, same batch",
                           "losses": traj},
            "step1_loss_over_masks": {"samples": MASK_SAMPLES, "min": min(samples), "max": max(samples),
                                      "mean": float(np.mean(samples)), "std": float(np.std(samples))},
        }

    # onnxruntime on the exported file, against PyTorch
    feeds = {n: npy(byname[n]) for n in graph_inputs}
    try:
        got = ort_run(data, feeds)
        ol = got.get("loss", list(got.values())[-1])
        lerr = rel(ol, npy(loss))
        oerr = rel(got["logits"], npy(logits)) if "logits" in got else None
        if mode == "train":
            # onnxruntime drops Dropout nodes (its EliminateDropout rewrite):
            # compared with PyTorch in train mode with dropout p = 0
            model.load_state_dict(init_state)
            drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
            for m in drops:
                m.p = 0.0
            with torch.no_grad():
                nd_logits, nd_loss = model(*inputs)
            for m in drops:
                m.p = 0.25
            model.load_state_dict(init_state)
            lerr = rel(ol, npy(nd_loss))
            oerr = rel(got["logits"], npy(nd_logits)) if "logits" in got else None
            info["onnxruntime"] = {"status": "ok" if lerr <= ORT_TOL else "MISMATCH",
                                   "note": "onnxruntime removes Dropout nodes, so this compares with PyTorch in "
                                           "train mode with Dropout p=0 (train-mode BatchNorm)",
                                   "loss_rel_err": lerr, "logits_rel_err": oerr,
                                   "loss": float(ol), "torch_loss_without_dropout": float(nd_loss.item())}
        else:
            info["onnxruntime"] = {"status": "ok" if lerr <= ORT_TOL else "MISMATCH",
                                   "loss_rel_err": lerr, "logits_rel_err": oerr,
                                   "loss": float(ol), "torch_loss": float(loss.item())}
    except Exception as e:
        info["onnxruntime"] = {"status": "error: " + short(e, 200)}

    ref = {
        "case": case, "model": name, "mode": mode,
        "torch": torch.__version__, "onnx": onnx.__version__, "numpy": np.__version__,
        "command": "python3 testsuite/zoo/export_zoo.py",
        "exporter": exporter_text(exporter, mode), "opset": OPSETS[exporter],
        "config": cfg,
        "inputs": [{"name": n, "file": "input_%d.pb" % k, "shape": list(byname[n].shape),
                    "dtype": str(npy(byname[n]).dtype)} for k, n in enumerate(graph_inputs)],
        "outputs": [{"name": "logits", "file": "output_0.pb", "shape": list(logits.shape)},
                    {"name": "loss", "file": "output_1.pb", "shape": []}],
        "graph_outputs": outputs,
        "parameters": params,
        "frozen_parameters": frozen,
        "buffers": buffers,
        "constants": constants,
        "freeze": freeze,
        "freeze_note": "floating-point initializers the graph uses that are not trained PyTorch parameters "
                       "(frozen parameters, buffers, exporter constants): novac trains every floating-point "
                       "initializer unless --freeze names it, so test_zoo.py passes these",
        "sgd": {"optimizer": "torch.optim.SGD", "lr": SGD_LR},
        "onnxruntime": info["onnxruntime"],
    }
    if train_extra:
        ref["train_mode"] = train_extra
    with open(os.path.join(mdir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    info["ops"] = op_counts(onnx_model)
    info["model_bytes"] = len(data)
    info["dir_bytes"] = dir_size(mdir)
    info["initializers"] = len(onnx_model.graph.initializer)
    info["nodes"] = len(onnx_model.graph.node)
    info["parameters_without_initializer"] = [e["torch"] for e in params if not e["initializer"] and not e.get("unused")]
    info["unused_parameters"] = [e["torch"] for e in params if e.get("unused")]
    info["shared_parameters"] = [e["torch"] for e in params if "copies" in e]
    info["transposed_parameters"] = [e["torch"] for e in params if e.get("layout") == "transposed"]
    info["frozen"] = [e["torch"] for e in frozen]
    info["freeze"] = len(freeze)
    if info["onnxruntime"]["status"] == "MISMATCH":
        # the file computes something else than the PyTorch module: not a case
        why = "onnxruntime's loss differs from PyTorch's (relative error %.3g)" % info["onnxruntime"]["loss_rel_err"]
        if mode == "train" and any(n.op_type == "BatchNormalization" and
                                   not any(a.name == "training_mode" and a.i == 1 for a in n.attribute)
                                   for n in onnx_model.graph.node):
            why = ("the module is in train mode but the exported BatchNormalization nodes have no "
                   "training_mode=1 (they normalize with the running statistics): " + why)
        info["export"] = "wrong"
        info["error"] = why
        shutil.rmtree(mdir)
        info.pop("dir_bytes")
    return info


def exporter_text(exporter, mode):
    if exporter == "ts":
        return ("torch.onnx.export(dynamo=False, opset_version=17, training=%s, do_constant_folding=True)"
                % ("TrainingMode.TRAINING" if mode == "train" else "TrainingMode.PRESERVE (model.eval())"))
    return ("torch.onnx.export(dynamo=True, opset_version=18, optimize=False) (model.%s()), then "
            "onnxscript.optimizer.optimize_ir without folding nodes that read a parameter and without "
            "the BatchNorm-into-Conv fusion" % ("train" if mode == "train" else "eval"))


def dir_size(d):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=HERE)
    ap.add_argument("models", nargs="*", help="subset of: " + " ".join(m[0] for m in MODELS))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    no_bn_fusion()
    import logging
    logging.disable(logging.WARNING)
    zoo_path = os.path.join(args.out, "zoo.json")
    old = {}
    if args.models and os.path.exists(zoo_path):
        old = {c["case"]: c for c in json.load(open(zoo_path))["cases"]}
    cases = []
    for name, make, seed, modes in MODELS:
        if args.models and name not in args.models:
            cases += [c for c in old.values() if c["model"] == name]
            continue
        for mode in modes:
            for exporter in ("ts", "dynamo"):
                info = export_case(name, make, seed, mode, exporter, args.out)
                cases.append(info)
                if info["export"] == "ok":
                    print("%-28s %8d bytes (dir %8d)  onnxruntime: %s" % (
                        info["case"], info["model_bytes"], info["dir_bytes"], info["onnxruntime"]["status"]),
                        flush=True)
                else:
                    print("%-28s export %s: %s" % (info["case"], info["export"].upper(), info["error"]),
                          flush=True)
    import onnxruntime
    import torchvision
    import transformers
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                "transformers": transformers.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}
    try:
        import onnxscript
        versions["onnxscript"] = onnxscript.__version__
    except Exception:
        pass
    with open(zoo_path, "w") as f:
        json.dump({"versions": versions, "batch": BATCH, "seq": SEQ, "cases": cases}, f, indent=1)
        f.write("\n")
    total = dir_size(args.out)
    print("files:")
    for r, ds, fs in sorted(os.walk(args.out)):
        ds.sort()
        for fn in sorted(fs):
            p = os.path.join(r, fn)
            if fn.endswith(".onnx") or fn in ("zoo.json", "reference.json"):
                print("  %9d  %s" % (os.path.getsize(p), os.path.relpath(p, args.out)))
    print("total size of %s: %d bytes (%.2f MB)" % (args.out, total, total / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
