"""A GPT of any size as .nova text, and the PyTorch module that computes the
same function, for the GPU benchmark (bench/bench_gpu.py): GPT-2 small
(12 layers, width 768, 12 heads, context 1024, vocabulary 50257) is 124M
parameters, 500 MB as an ONNX file; as .nova text its parameters are drawn
at run time (normal(0.02), LayerNorm weights ones), so the compiled step
carries no weights and travels to a GPU machine in a few MB.

The architecture is examples/transformer_block.nova's, stacked: token and
position embeddings, per layer a pre-norm causal self-attention (one fused
QKV projection with bias, heads of width D / H, an additive causal mask,
softmax, the output projection with bias) and a pre-norm MLP (4D, exact
GELU), a final LayerNorm and an untied language-model head without bias;
the loss is the mean cross-entropy over every position.

    python3 bench/gpt_nova.py LAYERS D HEADS T VOCAB > gpt.nova
"""
import math
import sys

GPT2_SMALL = {"layers": 12, "d": 768, "heads": 12, "t": 1024, "vocab": 50257}


def gpt_text(layers, d, heads, t, vocab):
    """The .nova text of the GPT (batch symbolic: --dim=batch=B)."""
    hs = d // heads
    if hs * heads != d:
        raise ValueError("the width %d is not a multiple of the heads %d" % (d, heads))
    L = ["# bench/gpt_nova.py: a GPT of %d layers, width %d, %d heads of %d, context %d, vocabulary %d"
         % (layers, d, heads, hs, t, vocab),
         "input tokens: i64[batch, %d]" % t, "label targets: i64[batch, %d]" % t,
         "param wte: f32[%d, %d] = normal(0.02)" % (vocab, d), "param wpe: f32[%d, %d] = normal(0.02)" % (t, d)]
    for i in range(layers):
        L += ["param l%d_ln1_g: f32[%d] = ones" % (i, d), "param l%d_ln1_b: f32[%d] = zeros" % (i, d),
              "param l%d_w_qkv: f32[%d, %d] = normal(0.02)" % (i, d, 3 * d),
              "param l%d_b_qkv: f32[%d] = zeros" % (i, 3 * d),
              "param l%d_w_proj: f32[%d, %d] = normal(0.02)" % (i, d, d), "param l%d_b_proj: f32[%d] = zeros" % (i, d),
              "param l%d_ln2_g: f32[%d] = ones" % (i, d), "param l%d_ln2_b: f32[%d] = zeros" % (i, d),
              "param l%d_w_fc: f32[%d, %d] = normal(0.02)" % (i, d, 4 * d),
              "param l%d_b_fc: f32[%d] = zeros" % (i, 4 * d),
              "param l%d_w_out: f32[%d, %d] = normal(0.02)" % (i, 4 * d, d),
              "param l%d_b_out: f32[%d] = zeros" % (i, d)]
    L += ["param lnf_g: f32[%d] = ones" % d, "param lnf_b: f32[%d] = zeros" % d,
          "param w_head: f32[%d, %d] = normal(0.02)" % (d, vocab),
          "const mask: f32[%d, %d] = causal_mask(-1e9)" % (t, t), "",
          "h0 = gather(wte, tokens) + wpe"]
    scale = repr(1.0 / math.sqrt(hs))
    for i in range(layers):
        h, p = "h%d" % (i + 1), "l%d_" % i
        L += ["a%d = layer_norm(h%d, %sln1_g, %sln1_b)" % (i, i, p, p),
              "qkv%d = a%d @ %sw_qkv + %sb_qkv" % (i, i, p, p)]
        for n, (s, perm) in enumerate((("q", "0, 2, 1, 3"), ("k", "0, 2, 3, 1"), ("v", "0, 2, 1, 3"))):
            L.append("%s%d = transpose(reshape(slice(qkv%d, axis=2, start=%d, end=%d), shape=[batch, %d, %d, %d]), "
                     "perm=[%s])" % (s, i, i, n * d, (n + 1) * d, t, heads, hs, perm))
        L += ["att%d = softmax((q%d @ k%d) * %s + mask, axis=-1)" % (i, i, i, scale),
              "y%d = reshape(transpose(att%d @ v%d, perm=[0, 2, 1, 3]), shape=[batch, %d, %d])" % (i, i, i, t, d),
              "r%d = h%d + y%d @ %sw_proj + %sb_proj" % (i, i, i, p, p),
              "m%d = layer_norm(r%d, %sln2_g, %sln2_b)" % (i, i, p, p),
              "%s = r%d + gelu(m%d @ %sw_fc + %sb_fc) @ %sw_out + %sb_out" % (h, i, i, p, p, p, p)]
    L += ["logits = layer_norm(h%d, lnf_g, lnf_b) @ w_head" % layers, "output logits",
          "output loss = cross_entropy(logits, targets)", ""]
    return "\n".join(L)


def matmul_params(layers, d, vocab):
    """Parameters that the matmuls read (the FLOP count's N): every layer's
    QKV, projection and MLP weights and the head (not the embeddings)."""
    return layers * (3 * d * d + d * d + 8 * d * d) + d * vocab


def step_flop(layers, d, t, vocab, batch):
    """FLOP of one training step (forward + backward, 3x the forward's):
    6 N per token for the weights' matmuls, and the attention products
    (Q K^T and P V, 2 T^2 D a sequence and layer each in the forward,
    the whole T x T computed: the mask is added, not skipped)."""
    tokens = batch * t
    return 6.0 * matmul_params(layers, d, vocab) * tokens + 3.0 * 4.0 * batch * t * t * d * layers


def torch_gpt(layers, d, heads, t, vocab):
    """The PyTorch module of gpt_text's model: forward(idx, targets) -> (logits, loss)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.register_buffer("mask", torch.triu(torch.full((t, t), -1e9), diagonal=1), persistent=False)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(B, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            att = torch.softmax(q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d // heads)) + self.mask, dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(B, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(t, d)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.lnf = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                    if getattr(m, "bias", None) is not None:
                        nn.init.zeros_(m.bias)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe.weight
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.lnf(x))
            return logits, F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    return GPT()


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    sys.stdout.write(gpt_text(*map(int, sys.argv[1:])))
