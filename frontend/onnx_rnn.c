/* onnx_rnn.c: ONNX RNN, GRU and LSTM -> nova nodes, unrolled over the
 * (static) sequence.
 *
 * The input projection of every step is one matmul, X [seq * batch, in] by
 * W^T; each step then adds H(t-1) R^T and the biases and applies the cell
 * (gate orders as ONNX defines them: GRU z r h, LSTM i o f c, with
 * peepholes, clip, input_forget, linear_before_reset and the activation
 * functions named by the node).  Directions forward, reverse and
 * bidirectional; layout 0 and 1.  sequence_lens shorter than the sequence
 * freeze the state and zero Y past each batch's length (forward only).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

enum { CELL_RNN, CELL_GRU, CELL_LSTM };

typedef struct act {
  char name[24];
  double alpha, beta;
} act;

typedef struct rnn {
  ox_ctx *x;
  int cell, ngates;
  int64_t H, batch, seq;
  act f, g, h;      /* per direction: the first three (RNN: f only; GRU: f, g) */
  double clip;      /* 0: none */
  bool input_forget, linear_before_reset;
  nv_node *lens_mask_src; /* sequence_lens [batch] or NULL */
} rnn;

static nv_node *K(ox_ctx *x, const nv_node *like, double v) { return like ? ox_scalar(x, like->dtype, v) : NULL; }

static nv_node *apply(ox_ctx *x, const act *a, nv_node *v) {
  if (!v) return NULL;
  const char *n = a->name;
  if (!strcmp(n, "Sigmoid")) return ox_op1(x, NV_OP_SIGMOID, v);
  if (!strcmp(n, "Tanh")) return ox_op1(x, NV_OP_TANH, v);
  if (!strcmp(n, "Relu")) return ox_op1(x, NV_OP_RELU, v);
  if (!strcmp(n, "Affine")) return ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, v, K(x, v, a->alpha)), K(x, v, a->beta));
  if (!strcmp(n, "LeakyRelu"))
    return ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_LESS, v, K(x, v, 0)), ox_op2(x, NV_OP_MUL, v, K(x, v, a->alpha)), v);
  if (!strcmp(n, "ThresholdedRelu"))
    return ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_GREATER, v, K(x, v, a->alpha)), v, K(x, v, 0));
  if (!strcmp(n, "ScaledTanh"))
    return ox_op2(x, NV_OP_MUL, K(x, v, a->alpha), ox_op1(x, NV_OP_TANH, ox_op2(x, NV_OP_MUL, v, K(x, v, a->beta))));
  if (!strcmp(n, "HardSigmoid")) {
    nv_node *l = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, v, K(x, v, a->alpha)), K(x, v, a->beta));
    return ox_op2(x, NV_OP_MAXIMUM, ox_op2(x, NV_OP_MINIMUM, l, K(x, v, 1)), K(x, v, 0));
  }
  if (!strcmp(n, "Elu"))
    return ox_op3(x, NV_OP_WHERE, ox_op2(x, NV_OP_LESS, v, K(x, v, 0)),
                  ox_op2(x, NV_OP_MUL, K(x, v, a->alpha), ox_op2(x, NV_OP_SUB, ox_op1(x, NV_OP_EXP, v), K(x, v, 1))), v);
  if (!strcmp(n, "Softsign")) return ox_op2(x, NV_OP_DIV, v, ox_op2(x, NV_OP_ADD, K(x, v, 1), ox_op1(x, NV_OP_ABS, v)));
  /* Softplus: relu(v) + log(1 + exp(-|v|)) */
  nv_node *t = ox_op1(x, NV_OP_EXP, ox_op1(x, NV_OP_NEG, ox_op1(x, NV_OP_ABS, v)));
  return ox_op2(x, NV_OP_ADD, ox_op1(x, NV_OP_RELU, v), ox_op1(x, NV_OP_LOG, ox_op2(x, NV_OP_ADD, K(x, v, 1), t)));
}

static const char *const ACTS[] = {"Sigmoid", "Tanh", "Relu", "Affine", "LeakyRelu", "ThresholdedRelu",
                                   "ScaledTanh", "HardSigmoid", "Elu", "Softsign", "Softplus"};

/* The activation at position i of the node's lists (default dflt). */
static int read_act(ox_ctx *x, int i, const char *dflt, act *a) {
  const Onnx__AttributeProto *as = ox_attr(x, "activations");
  const Onnx__AttributeProto *al = ox_attr(x, "activation_alpha"), *be = ox_attr(x, "activation_beta");
  snprintf(a->name, sizeof a->name, "%s", dflt);
  if (as && (size_t)i < as->n_strings)
    snprintf(a->name, sizeof a->name, "%.*s", (int)as->strings[i].len, (const char *)as->strings[i].data);
  bool known = false;
  for (size_t k = 0; k < sizeof ACTS / sizeof *ACTS; k++) known |= !strcmp(a->name, ACTS[k]);
  if (!known) return ox_err(x, "activation '%s' is not one ONNX defines", a->name);
  bool hs = !strcmp(a->name, "HardSigmoid");
  a->alpha = !strcmp(a->name, "LeakyRelu") ? 0.01 : hs ? 0.2 : 1.0;
  a->beta = hs ? 0.5 : !strcmp(a->name, "Affine") ? 0.0 : 1.0;
  if (al && (size_t)i < al->n_floats) a->alpha = al->floats[i];
  if (be && (size_t)i < be->n_floats) a->beta = be->floats[i];
  return 0;
}

static nv_node *clipped(const rnn *R, nv_node *v) {
  if (!v || R->clip <= 0) return v;
  return ox_op2(R->x, NV_OP_MINIMUM, ox_op2(R->x, NV_OP_MAXIMUM, v, K(R->x, v, -R->clip)), K(R->x, v, R->clip));
}

/* a[:, k H : (k + 1) H] */
static nv_node *gate(const rnn *R, nv_node *a, int k) { return ox_slice1(R->x, a, a->rank - 1, k * R->H, (k + 1) * R->H, 1); }

/* One direction: xw [seq, batch, G H] (X W^T + Wb), r [G H, H], rb [G H] or
 * NULL, p [3 H] or NULL, h0/c0 [batch, H]; fills y[t] and the last states. */
static int run_dir(rnn *R, nv_node *xw, nv_node *r, nv_node *rb, nv_node *p, nv_node *h, nv_node *c, bool reverse,
                   nv_node **y, nv_node **hlast, nv_node **clast) {
  ox_ctx *x = R->x;
  int64_t GH = R->ngates * R->H;
  nv_node *rt = ox_transpose(x, r, (int64_t[]){1, 0});
  nv_node *rh_t = R->cell == CELL_GRU ? ox_slice1(x, rt, 1, 2 * R->H, 3 * R->H, 1) : NULL;
  nv_node *rzr_t = R->cell == CELL_GRU ? ox_slice1(x, rt, 1, 0, 2 * R->H, 1) : NULL;
  for (int64_t s = 0; s < R->seq; s++) {
    int64_t t = reverse ? R->seq - 1 - s : s;
    nv_node *xt = ox_reshape(x, ox_slice1(x, xw, 0, t, t + 1, 1), 2, (int64_t[]){R->batch, GH});
    nv_node *hn, *cn = NULL;
    if (R->cell == CELL_GRU) {
      nv_node *zr = ox_op2(x, NV_OP_ADD, ox_slice1(x, xt, 1, 0, 2 * R->H, 1), ox_op2(x, NV_OP_MATMUL, h, rzr_t));
      if (rb) zr = ox_op2(x, NV_OP_ADD, zr, ox_slice1(x, rb, 0, 0, 2 * R->H, 1));
      zr = clipped(R, zr);
      nv_node *z = apply(x, &R->f, gate(R, zr, 0)), *rr = apply(x, &R->f, gate(R, zr, 1));
      nv_node *xh = gate(R, xt, 2), *rbh = rb ? ox_slice1(x, rb, 0, 2 * R->H, 3 * R->H, 1) : NULL, *pre;
      if (R->linear_before_reset) {
        nv_node *hr = ox_op2(x, NV_OP_MATMUL, h, rh_t);
        if (rbh) hr = ox_op2(x, NV_OP_ADD, hr, rbh);
        pre = ox_op2(x, NV_OP_ADD, xh, ox_op2(x, NV_OP_MUL, rr, hr));
      } else {
        pre = ox_op2(x, NV_OP_ADD, xh, ox_op2(x, NV_OP_MATMUL, ox_op2(x, NV_OP_MUL, rr, h), rh_t));
        if (rbh) pre = ox_op2(x, NV_OP_ADD, pre, rbh);
      }
      nv_node *ht = apply(x, &R->g, clipped(R, pre));
      hn = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, ox_op2(x, NV_OP_SUB, K(x, z, 1), z), ht), ox_op2(x, NV_OP_MUL, z, h));
    } else {
      nv_node *gates = ox_op2(x, NV_OP_ADD, xt, ox_op2(x, NV_OP_MATMUL, h, rt));
      if (rb) gates = ox_op2(x, NV_OP_ADD, gates, rb);
      if (R->cell == CELL_RNN) hn = apply(x, &R->f, clipped(R, gates));
      else { /* i o f c */
        nv_node *gi = gate(R, gates, 0), *go = gate(R, gates, 1), *gf = gate(R, gates, 2), *gc = gate(R, gates, 3);
        if (p) {
          gi = ox_op2(x, NV_OP_ADD, gi, ox_op2(x, NV_OP_MUL, ox_slice1(x, p, 0, 0, R->H, 1), c));
          gf = ox_op2(x, NV_OP_ADD, gf, ox_op2(x, NV_OP_MUL, ox_slice1(x, p, 0, 2 * R->H, 3 * R->H, 1), c));
        }
        nv_node *i = apply(x, &R->f, clipped(R, gi));
        nv_node *f = R->input_forget ? ox_op2(x, NV_OP_SUB, K(x, i, 1), i) : apply(x, &R->f, clipped(R, gf));
        nv_node *ct = apply(x, &R->g, clipped(R, gc));
        cn = ox_op2(x, NV_OP_ADD, ox_op2(x, NV_OP_MUL, f, c), ox_op2(x, NV_OP_MUL, i, ct));
        if (p) go = ox_op2(x, NV_OP_ADD, go, ox_op2(x, NV_OP_MUL, ox_slice1(x, p, 0, R->H, 2 * R->H, 1), cn));
        nv_node *o = apply(x, &R->f, clipped(R, go));
        hn = ox_op2(x, NV_OP_MUL, o, apply(x, &R->h, cn));
      }
    }
    if (!hn) return -1;
    nv_node *yt = hn;
    if (R->lens_mask_src) { /* past a batch's length: the state stays, Y is 0 */
      nv_node *live = ox_reshape(x, ox_op2(x, NV_OP_GREATER, R->lens_mask_src, ox_scalar(x, R->lens_mask_src->dtype, (double)t)),
                                 2, (int64_t[]){R->batch, 1});
      yt = ox_op3(x, NV_OP_WHERE, live, hn, K(x, hn, 0));
      hn = ox_op3(x, NV_OP_WHERE, live, hn, h);
      if (cn) cn = ox_op3(x, NV_OP_WHERE, live, cn, c);
      if (!yt || !hn) return -1;
    }
    y[t] = yt, h = hn, c = cn;
  }
  *hlast = h, *clast = c;
  return 0;
}

/* in[i] or a constant of zeros of the given shape */
static nv_node *opt_or_zeros(ox_ctx *x, ox_val *in, int nin, int i, nova_dtype dt, int rank, const int64_t *shape) {
  if (nin > i && in[i].present) return ox_N(x, in[i]);
  nv_node *z = fe_graph_leaf(x->g, x->d, NV_OP_CONSTANT, NULL, dt, rank, shape, x->loc);
  if (z) z->init.kind = NV_INIT_ZEROS;
  return z;
}

static int recurrent(ox_ctx *x, int cell, ox_val *in, int nin, ox_val *out, int nout) {
  if (ox_need(x, in, nin, 3, cell == CELL_LSTM ? 8 : 6)) return -1;
  rnn R = {.x = x, .cell = cell, .ngates = cell == CELL_LSTM ? 4 : cell == CELL_GRU ? 3 : 1};
  nv_node *X = ox_N(x, in[0]), *W = ox_N(x, in[1]), *Rw = ox_N(x, in[2]);
  if (!X || !W || !Rw) return -1;
  char buf[24];
  const char *dir = ox_attr_s(x, "direction", "forward", buf, sizeof buf);
  int nd = !strcmp(dir, "bidirectional") ? 2 : 1;
  if (nd == 1 && strcmp(dir, "forward") && strcmp(dir, "reverse")) return ox_err(x, "direction '%s'", dir);
  bool layout = ox_attr_i(x, "layout", 0) != 0;
  if (X->rank != 3 || W->rank != 3 || Rw->rank != 3) return ox_err(x, "X, W and R must be 3-D");
  if (layout) X = ox_transpose(x, X, (int64_t[]){1, 0, 2}); /* [seq, batch, in] */
  if (!X) return -1;
  R.seq = X->shape[0], R.batch = X->shape[1], R.H = ox_attr_i(x, "hidden_size", Rw->shape[2]);
  int64_t GH = R.ngates * R.H, in_sz = X->shape[2];
  if (W->shape[0] != nd || W->shape[1] != GH || W->shape[2] != in_sz || Rw->shape[0] != nd || Rw->shape[1] != GH ||
      Rw->shape[2] != R.H)
    return ox_err(x, "W must be [%d, %lld, %lld] and R [%d, %lld, %lld]", nd, (long long)GH, (long long)in_sz, nd,
                  (long long)GH, (long long)R.H);
  if (R.seq > 1024) return ox_err(x, "sequences longer than 1024 steps are not supported (unrolled)");
  R.clip = ox_attr_f(x, "clip", 0);
  R.input_forget = ox_attr_i(x, "input_forget", 0) != 0;
  R.linear_before_reset = ox_attr_i(x, "linear_before_reset", 0) != 0;
  nova_dtype dt = X->dtype;
  nv_node *B = nin > 3 && in[3].present ? ox_N(x, in[3]) : NULL;
  if (nin > 4 && in[4].present) {
    nv_node *lens = ox_N(x, in[4]);
    if (!lens || lens->rank != 1 || lens->shape[0] != R.batch || !fe_dtype_is_int(lens->dtype))
      return ox_err(x, "sequence_lens must be int32 [batch]");
    bool full = in[4].k != NULL;
    for (int64_t b = 0; full && b < R.batch; b++) full = ox_geti(in[4].k, b) == R.seq;
    if (!full) {
      if (strcmp(dir, "forward")) return ox_err(x, "sequence_lens shorter than the sequence need direction forward");
      R.lens_mask_src = lens;
    }
  }
  int64_t hs[3] = {nd, R.batch, R.H};
  nv_node *H0 = opt_or_zeros(x, in, nin, 5, dt, 3, hs), *C0 = cell == CELL_LSTM ? opt_or_zeros(x, in, nin, 6, dt, 3, hs) : NULL;
  nv_node *P = cell == CELL_LSTM && nin > 7 && in[7].present ? ox_N(x, in[7]) : NULL;
  if (!H0 || (cell == CELL_LSTM && !C0)) return -1;
  nv_node **y = nv_xcalloc((size_t)(nd * R.seq), sizeof *y);
  nv_node *hl[2] = {0}, *cl[2] = {0};
  if (!y) return -1;
  int rc = 0;
  for (int d = 0; d < nd && !rc; d++) {
    const char *dfl[3] = {cell == CELL_RNN ? "Tanh" : "Sigmoid", "Tanh", "Tanh"};
    int na = cell == CELL_RNN ? 1 : cell == CELL_GRU ? 2 : 3;
    act *as[3] = {&R.f, &R.g, &R.h};
    for (int k = 0; k < na && !rc; k++) rc = read_act(x, d * na + k, dfl[k], as[k]);
    if (rc) break;
    nv_node *wd = ox_reshape(x, ox_slice1(x, W, 0, d, d + 1, 1), 2, (int64_t[]){GH, in_sz});
    nv_node *rd = ox_reshape(x, ox_slice1(x, Rw, 0, d, d + 1, 1), 2, (int64_t[]){GH, R.H});
    nv_node *xw = ox_op2(x, NV_OP_MATMUL, ox_reshape(x, X, 2, (int64_t[]){R.seq * R.batch, in_sz}),
                         ox_transpose(x, wd, (int64_t[]){1, 0}));
    nv_node *wb = NULL, *rb = NULL;
    if (B) {
      nv_node *bd = ox_reshape(x, ox_slice1(x, B, 0, d, d + 1, 1), 1, (int64_t[]){2 * GH});
      wb = ox_slice1(x, bd, 0, 0, GH, 1), rb = ox_slice1(x, bd, 0, GH, 2 * GH, 1);
      if (cell != CELL_GRU) rb = ox_op2(x, NV_OP_ADD, wb, rb), wb = NULL; /* both before the cell */
    }
    if (wb) xw = ox_op2(x, NV_OP_ADD, xw, wb);
    xw = ox_reshape(x, xw, 3, (int64_t[]){R.seq, R.batch, GH});
    nv_node *h0 = ox_reshape(x, ox_slice1(x, H0, 0, d, d + 1, 1), 2, (int64_t[]){R.batch, R.H});
    nv_node *c0 = C0 ? ox_reshape(x, ox_slice1(x, C0, 0, d, d + 1, 1), 2, (int64_t[]){R.batch, R.H}) : NULL;
    nv_node *pd = P ? ox_reshape(x, ox_slice1(x, P, 0, d, d + 1, 1), 1, (int64_t[]){3 * R.H}) : NULL;
    if (!xw || !rd || !h0 || (B && !rb)) rc = -1;
    else rc = run_dir(&R, xw, rd, rb, pd, h0, c0, d == 1 || !strcmp(dir, "reverse"), y + d * R.seq, &hl[d], &cl[d]);
  }
  /* Y [seq, nd, batch, H]; Y_h, Y_c [nd, batch, H] */
  nv_node *Y = NULL, *Yh = NULL, *Yc = NULL;
  nv_node a0 = {.axis = 0}, a1 = {.axis = 1};
  for (int64_t t = 0; !rc && t < R.seq; t++) {
    nv_node *row = NULL;
    for (int d = 0; d < nd; d++) {
      nv_node *p4 = ox_reshape(x, y[d * R.seq + t], 4, (int64_t[]){1, 1, R.batch, R.H});
      row = row ? ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){row, p4}, &a1) : p4;
    }
    Y = Y ? ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){Y, row}, &a0) : row;
    if (!Y) rc = -1;
  }
  for (int d = 0; !rc && d < nd; d++) {
    nv_node *h3 = ox_reshape(x, hl[d], 3, (int64_t[]){1, R.batch, R.H});
    Yh = Yh ? ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){Yh, h3}, &a0) : h3;
    if (cl[d]) {
      nv_node *c3 = ox_reshape(x, cl[d], 3, (int64_t[]){1, R.batch, R.H});
      Yc = Yc ? ox_add(x, NV_OP_CONCAT, 2, (nv_node *[]){Yc, c3}, &a0) : c3;
    }
  }
  free(y);
  if (rc || !Y || !Yh) return -1;
  if (layout) {
    Y = ox_transpose(x, Y, (int64_t[]){2, 0, 1, 3});
    Yh = ox_transpose(x, Yh, (int64_t[]){1, 0, 2});
    if (Yc) Yc = ox_transpose(x, Yc, (int64_t[]){1, 0, 2});
  }
  nv_node *outs[3] = {Y, Yh, Yc};
  for (int i = 0; i < nout && i < 3; i++) {
    if (!outs[i]) return -1;
    out[i] = (ox_val){.node = outs[i], .present = true};
  }
  return 0;
}

static int cv_rnn(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { return recurrent(x, CELL_RNN, in, nin, out, nout); }
static int cv_gru(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { return recurrent(x, CELL_GRU, in, nin, out, nout); }
static int cv_lstm(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) { return recurrent(x, CELL_LSTM, in, nin, out, nout); }

const ox_op_entry ox_rnn_ops[] = {{"RNN", cv_rnn}, {"GRU", cv_gru}, {"LSTM", cv_lstm}};
const size_t ox_rnn_nops = sizeof ox_rnn_ops / sizeof *ox_rnn_ops;
