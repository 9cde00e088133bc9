"""numpy float64 references of the window ops, attention, rms_norm and rotary, shared by the op and gradient tests."""
import numpy as np


def conv_ref(x, w, strides, pads, dil, groups):
    ns = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[ns + i]) for i in range(ns)])
    N, C = x.shape[:2]
    F, Cg = w.shape[:2]
    K = w.shape[2:]
    O = [(xp.shape[2 + i] - dil[i] * (K[i] - 1) - 1) // strides[i] + 1 for i in range(ns)]
    y = np.zeros((N, F, *O))
    Fg = F // groups
    for o in np.ndindex(*O):
        for k in np.ndindex(*K):
            idx = tuple(o[i] * strides[i] + k[i] * dil[i] for i in range(ns))
            xs = xp[(slice(None), slice(None)) + idx]  # N, C
            for g in range(groups):
                y[(slice(None), slice(g * Fg, (g + 1) * Fg)) + o] += xs[:, g * Cg:(g + 1) * Cg] @ w[(slice(g * Fg, (g + 1) * Fg), slice(None)) + k].T
    return y


def pool_ref(x, K, S, pads, ceil, kind, incl):
    ns = x.ndim - 2
    I = x.shape[2:]
    O = []
    for i in range(ns):
        span = I[i] + pads[i] + pads[ns + i] - (K[i] - 1) - 1
        o = (-(-span // S[i]) if ceil else span // S[i]) + 1
        if ceil and (o - 1) * S[i] >= I[i] + pads[i]:
            o -= 1
        O.append(o)
    y = np.zeros(x.shape[:2] + tuple(O))
    for o in np.ndindex(*O):
        vals, cnt = [], 0
        for k in np.ndindex(*K):
            p = [o[i] * S[i] + k[i] - pads[i] for i in range(ns)]
            inside = all(0 <= p[i] < I[i] for i in range(ns))
            inpad = all(-pads[i] <= p[i] < I[i] + pads[ns + i] for i in range(ns))
            if inside:
                vals.append(x[(slice(None), slice(None)) + tuple(p)])
            cnt += inpad if incl else inside
        v = np.stack(vals)
        y[(slice(None), slice(None)) + o] = v.max(0) if kind == "max" else v.sum(0) / cnt
    return y


def attention_ref(q, k, v, bias=0.0, scale=None, cap=0.0):
    """nova.attention: softmax(scale q k^T (capped) + bias) v, grouped heads,
    0 for rows whose keys are all masked."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = (q @ np.swapaxes(k, -1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if cap:
        s = cap * np.tanh(s / cap)
    z = s + bias
    m = z.max(-1, keepdims=True)
    e = np.exp(z - np.where(m == -np.inf, 0, m))
    den = e.sum(-1, keepdims=True)
    return (e / np.where(den == 0, 1, den)) @ v


def rms_norm_ref(x, g, eps=1e-5):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rotary_ref(x, c, s, interleaved=False):
    """The pairs (x1, x2) of the last axis (halves, or even and odd elements)
    rotated: (x1 c - x2 s, x2 c + x1 s), put back where they came from."""
    h = x.shape[-1] // 2
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :h], x[..., h:])
    re, im = x1 * c - x2 * s, x2 * c + x1 * s
    if interleaved:
        return np.stack([re, im], -1).reshape(np.broadcast_shapes(x.shape[:-1], c.shape[:-1]) + (2 * h,))
    return np.concatenate([re, im], -1)
