/* onnx_seq.c: ONNX sequences, resolved at compile time.
 *
 * Exporters write torch.split / chunk / unbind followed by indexing as
 * SplitToSequence -> SequenceAt, and list building followed by torch.cat /
 * stack as SequenceConstruct -> ConcatFromSequence.  With static shapes the
 * length of such a sequence and the shape of every element are known when
 * compiling, so a sequence is an ox_seq: a list of the importer's tensor
 * values (nodes the step computes, or known tensors).  Nothing of it reaches
 * the step: SplitToSequence becomes slices (host slices of a known input,
 * so folding goes on), SequenceAt picks an element, ConcatFromSequence
 * becomes concats (folded when every element is known), SequenceLength is
 * an int64 constant.  Positions must be known at compile time and in range.
 *
 * Ownership: a sequence owns its elements' known tensors; an operator's
 * output is always a fresh copy (ox_val_copy), its inputs are borrowed.
 */
#include <stdlib.h>
#include <string.h>

#include "../support/util.h"
#include "onnx.h"

/* Longest sequence novac builds (each element is a value of its own). */
#define SEQ_MAX 65536

/* ---- the value ----------------------------------------------------------- */

ox_seq *ox_seq_create(nova_dtype dt) {
  ox_seq *s = nv_xcalloc(1, sizeof *s);
  if (s) s->dt = dt;
  return s;
}

void ox_seq_destroy(ox_seq *s) {
  if (!s) return;
  for (int i = 0; i < s->n; i++) ox_val_free(&s->v[i]);
  free(s->v);
  free(s);
}

void ox_val_free(ox_val *v) {
  ox_tensor_free(v->k);
  ox_seq_destroy(v->seq);
  v->k = NULL;
  v->seq = NULL;
}

/* Inserts the owned tensor value v at position pos (0..n); on failure v is freed. */
static int seq_insert(ox_seq *s, int pos, ox_val v) {
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 8;
    ox_val *nv = nv_xrealloc(s->v, (size_t)cap * sizeof *nv);
    if (!nv) {
      ox_val_free(&v);
      return -1;
    }
    s->v = nv, s->cap = cap;
  }
  memmove(&s->v[pos + 1], &s->v[pos], (size_t)(s->n - pos) * sizeof *s->v);
  s->v[pos] = v;
  s->n++;
  return 0;
}

static ox_tensor *tensor_copy(const ox_tensor *t) {
  ox_tensor *c = ox_tensor_new(t->dt, t->rank, t->shape);
  if (c) memcpy(c->data, t->data, (size_t)ox_numel(t) * fe_dtype_size(t->dt));
  return c;
}

int ox_val_copy(ox_val v, ox_val *out) {
  *out = (ox_val){.node = v.node, .present = v.present};
  if (v.k && !(out->k = tensor_copy(v.k))) return -1;
  if (!v.seq) return 0;
  if (!(out->seq = ox_seq_create(v.seq->dt))) return -1;
  for (int i = 0; i < v.seq->n; i++) {
    ox_val e;
    if (ox_val_copy(v.seq->v[i], &e) || seq_insert(out->seq, i, e)) {
      ox_val_free(&e);
      ox_val_free(out);
      return -1;
    }
  }
  return 0;
}

/* ---- what takes sequences ------------------------------------------------------ */

bool ox_takes_seq(const char *op) {
  if (!strcmp(op, "Identity")) return true;
  for (size_t i = 0; i < ox_seq_nops; i++)
    if (!strcmp(ox_seq_ops[i].name, op)) return true;
  return false;
}

static const char *in_name(ox_ctx *x, int i) {
  return x->node && i < (int)x->node->n_input && x->node->input[i] ? x->node->input[i] : "";
}

int ox_tensors_only(ox_ctx *x, const ox_val *in, int nin) {
  for (int i = 0; i < nin; i++)
    if (in[i].seq)
      return ox_err(x, "input %d ('%s') is a sequence of %d tensors; %s takes a tensor there", i, in_name(x, i),
                    in[i].seq->n, x->node->op_type);
  return 0;
}

static const char *type_str(const Onnx__TypeProto *t, char *buf, size_t n, int depth) {
  char inner[200];
  if (!t) snprintf(buf, n, "no type");
  else if (depth > 8) snprintf(buf, n, "...");
  else if (t->value_case == ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE && t->tensor_type)
    snprintf(buf, n, "tensor(%s)", ox_onnx_type_name(t->tensor_type->elem_type));
  else if (t->value_case == ONNX__TYPE_PROTO__VALUE_SPARSE_TENSOR_TYPE && t->sparse_tensor_type)
    snprintf(buf, n, "sparse_tensor(%s)", ox_onnx_type_name(t->sparse_tensor_type->elem_type));
  else if (t->value_case == ONNX__TYPE_PROTO__VALUE_SEQUENCE_TYPE && t->sequence_type)
    snprintf(buf, n, "seq(%s)", type_str(t->sequence_type->elem_type, inner, sizeof inner, depth + 1));
  else if (t->value_case == ONNX__TYPE_PROTO__VALUE_OPTIONAL_TYPE && t->optional_type)
    snprintf(buf, n, "optional(%s)", type_str(t->optional_type->elem_type, inner, sizeof inner, depth + 1));
  else if (t->value_case == ONNX__TYPE_PROTO__VALUE_MAP_TYPE && t->map_type)
    snprintf(buf, n, "map(%s,%s)", ox_onnx_type_name(t->map_type->key_type),
             type_str(t->map_type->value_type, inner, sizeof inner, depth + 1));
  else snprintf(buf, n, "an unknown type");
  return buf;
}

const char *ox_type_str(const Onnx__TypeProto *t, char *buf, size_t n) { return type_str(t, buf, n, 0); }

/* ---- operands ---------------------------------------------------------------- */

static ox_seq *seq_operand(ox_ctx *x, ox_val *in, int nin, int i) {
  if (i >= nin || !in[i].present) {
    ox_err(x, "input %d (the sequence) is required", i);
    return NULL;
  }
  if (!in[i].seq) {
    ox_err(x, "input %d ('%s') is a tensor; %s takes a sequence there", i, in_name(x, i), x->node->op_type);
    return NULL;
  }
  return in[i].seq;
}

static nova_dtype val_dtype(ox_val v) { return v.node ? v.node->dtype : v.k->dt; }

/* A position in a sequence of n: known, one int32/int64 element, in
 * [-n, n - 1] (or [-n, n] where one inserts); made non-negative. */
static int position(ox_ctx *x, ox_val v, int n, bool insert, int64_t *pos) {
  if (v.seq) return ox_err(x, "the position ('%s') is a sequence, not a tensor", in_name(x, 1 + insert));
  if (!v.k) return ox_err(x, "the position must be known when compiling (a constant, or computed from shapes), not "
                          "computed by the step");
  if (!fe_dtype_is_index(v.k->dt) || ox_numel(v.k) != 1)
    return ox_err(x, "the position must be one int64 or int32, got %s %s", fe_dtype_name(v.k->dt),
                  fe_shape_str((char[160]){0}, 160, v.k->rank, v.k->shape));
  int64_t p = ox_geti(v.k, 0), hi = insert ? n : n - 1;
  if (p < -n || p > hi)
    return ox_err(x, "position %lld is out of range for a sequence of %d tensors ([%d, %lld])", (long long)p, n, -n,
                  (long long)hi);
  *pos = p < 0 ? p + n : p;
  return 0;
}

/* out[0] = a sequence of its own: a copy of s, or a new empty one of dtype dt. */
static int fresh(ox_seq *s, nova_dtype dt, ox_val *out) {
  if (s) return ox_val_copy((ox_val){.seq = s, .present = true}, out);
  *out = (ox_val){.seq = ox_seq_create(dt), .present = true};
  return out->seq ? 0 : -1;
}

/* ---- building and editing -------------------------------------------------------- */

static int cv_sequence_empty(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)in, (void)nout;
  if (nin) return ox_err(x, "takes no inputs, got %d", nin);
  int64_t t = ox_attr_i(x, "dtype", 1);
  nova_dtype dt = ox_dtype_of_onnx((int32_t)t);
  if (!dt) return ox_err(x, "dtype %s is not supported", ox_onnx_type_name((int32_t)t));
  return fresh(NULL, dt, out);
}

static int cv_sequence_construct(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, -1) || ox_tensors_only(x, in, nin)) return -1;
  nova_dtype dt = val_dtype(in[0]);
  for (int i = 1; i < nin; i++)
    if (val_dtype(in[i]) != dt)
      return ox_err(x, "input %d ('%s') is %s, input 0 is %s: a sequence holds one element type", i, in_name(x, i),
                    fe_dtype_name(val_dtype(in[i])), fe_dtype_name(dt));
  if (fresh(NULL, dt, out)) return -1;
  for (int i = 0; i < nin; i++) {
    ox_val e;
    if (ox_val_copy(in[i], &e) || seq_insert(out->seq, i, e)) return -1;
  }
  return 0;
}

static int cv_sequence_insert(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  ox_seq *s = seq_operand(x, in, nin, 0);
  if (!s || ox_need(x, in, nin, 2, 3) || ox_tensors_only(x, in + 1, 1)) return -1;
  if (val_dtype(in[1]) != s->dt)
    return ox_err(x, "the tensor is %s, the sequence holds %s", fe_dtype_name(val_dtype(in[1])), fe_dtype_name(s->dt));
  int64_t pos = s->n;
  if (nin > 2 && in[2].present && position(x, in[2], s->n, true, &pos)) return -1;
  if (s->n >= SEQ_MAX) return ox_err(x, "a sequence of more than %d tensors is not supported", SEQ_MAX);
  ox_val e;
  if (fresh(s, s->dt, out) || ox_val_copy(in[1], &e)) return -1;
  return seq_insert(out->seq, (int)pos, e);
}

static int cv_sequence_erase(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  ox_seq *s = seq_operand(x, in, nin, 0);
  if (!s || ox_need(x, in, nin, 1, 2)) return -1;
  if (!s->n) return ox_err(x, "the sequence is empty: there is nothing to erase");
  int64_t pos = s->n - 1;
  if (nin > 1 && in[1].present && position(x, in[1], s->n, false, &pos)) return -1;
  if (fresh(s, s->dt, out)) return -1;
  ox_seq *o = out->seq;
  ox_val_free(&o->v[pos]);
  memmove(&o->v[pos], &o->v[pos + 1], (size_t)(o->n - pos - 1) * sizeof *o->v);
  o->n--;
  return 0;
}

/* ---- reading ------------------------------------------------------------------------ */

static int cv_sequence_at(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  ox_seq *s = seq_operand(x, in, nin, 0);
  if (!s || ox_need(x, in, nin, 2, 2)) return -1;
  int64_t pos;
  if (position(x, in[1], s->n, false, &pos)) return -1;
  return ox_val_copy(s->v[pos], out);
}

static int cv_sequence_length(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  ox_seq *s = seq_operand(x, in, nin, 0);
  if (!s || ox_need(x, in, nin, 1, 1)) return -1;
  ox_tensor *t = ox_tensor_new(NOVA_DTYPE_I64, 0, NULL);
  if (t) ox_set(t, 0, (double)s->n, s->n);
  return ox_known(out, t);
}

/* ---- SplitToSequence ------------------------------------------------------------------ */

/* The part sizes along an axis of length dim: from `split` (a known scalar
 * chunk size, the last part smaller; or known 1-D sizes adding up to dim),
 * or parts of 1 when it is absent.  Returns the count (*sizes malloc'ed). */
static int split_sizes(ox_ctx *x, ox_val *in, int nin, int64_t dim, int64_t **sizes) {
  bool given = nin > 1 && in[1].present;
  const ox_tensor *t = given ? in[1].k : NULL;
  if (given && !t) return ox_err(x, "split must be known when compiling (a constant, or computed from shapes), not "
                                 "computed by the step");
  if (t && (!fe_dtype_is_index(t->dt) || t->rank > 1))
    return ox_err(x, "split must be an int64 or int32 scalar or 1-D tensor, got %s %s", fe_dtype_name(t->dt),
                  fe_shape_str((char[160]){0}, 160, t->rank, t->shape));
  int64_t chunk = !t ? 1 : t->rank == 0 ? ox_geti(t, 0) : 0;
  if (t && t->rank == 0 && chunk <= 0) return ox_err(x, "split (the chunk size) is %lld, not positive", (long long)chunk);
  int64_t n = chunk ? dim / chunk + (dim % chunk != 0) : ox_numel(t);
  if (n > SEQ_MAX) return ox_err(x, "%lld parts: a sequence of more than %d tensors is not supported", (long long)n, SEQ_MAX);
  if (!(*sizes = nv_xmalloc((size_t)(n ? n : 1) * sizeof **sizes))) return -1;
  int64_t sum = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t p = (*sizes)[i] = chunk ? (i < n - 1 ? chunk : dim - chunk * (n - 1)) : ox_geti(t, i);
    if (p < 0) return ox_err(x, "split part %lld has size %lld", (long long)i, (long long)p);
    if (p > dim - sum) return ox_err(x, "split sizes add up to more than the axis has (%lld)", (long long)dim);
    sum += p;
  }
  if (sum != dim) return ox_err(x, "split sizes add up to %lld, the axis has %lld", (long long)sum, (long long)dim);
  return (int)n;
}

/* t[.., start : start + len, ..] along axis, without it when squeeze (len 1). */
static ox_tensor *slice_known(const ox_tensor *t, int axis, int64_t start, int64_t len, bool squeeze) {
  int64_t shape[NOVA_MAX_RANK], outer = 1, inner = fe_dtype_size(t->dt);
  int r = 0;
  for (int k = 0; k < t->rank; k++) {
    if (k < axis) outer *= t->shape[k];
    if (k > axis) inner *= t->shape[k];
    if (k != axis || !squeeze) shape[r++] = k == axis ? len : t->shape[k];
  }
  ox_tensor *o = ox_tensor_new(t->dt, r, shape);
  if (!o) return NULL;
  for (int64_t i = 0; i < outer; i++)
    memcpy((char *)o->data + i * len * inner, (const char *)t->data + (i * t->shape[axis] + start) * inner,
           (size_t)(len * inner));
  return o;
}

/* One part of a: a known slice of a known a, else a slice node. */
static ox_val split_part(ox_ctx *x, ox_val a, int axis, int64_t start, int64_t len, bool squeeze) {
  if (a.k) return (ox_val){.k = slice_known(a.k, axis, start, len, squeeze), .present = true};
  nv_node *n = a.node;
  if (start || len != n->shape[axis]) n = ox_slice1(x, n, axis, start, start + len, 1);
  if (n && squeeze) {
    int64_t s[NOVA_MAX_RANK];
    for (int k = 0, r = 0; k < a.node->rank; k++)
      if (k != axis) s[r++] = a.node->shape[k];
    n = ox_reshape(x, n, a.node->rank - 1, s);
  }
  return (ox_val){.node = n, .present = true};
}

static int cv_split_to_sequence(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, 2) || ox_tensors_only(x, in, nin)) return -1;
  int rank = ox_val_rank(in[0]);
  int64_t axis = ox_attr_i(x, "axis", 0), *sizes = NULL;
  if (ox_norm_axis(x, &axis, rank)) return -1;
  if (rank == 0) return ox_err(x, "the input is a scalar: there is no axis to split");
  /* keepdims applies to parts of 1 only, when split is absent */
  bool squeeze = !(nin > 1 && in[1].present) && ox_attr_i(x, "keepdims", 1) == 0;
  int n = split_sizes(x, in, nin, ox_val_shape(in[0])[axis], &sizes);
  int rc = n < 0 ? -1 : fresh(NULL, val_dtype(in[0]), out);
  int64_t off = 0;
  for (int i = 0; !rc && i < n; off += sizes[i++]) {
    ox_val e = split_part(x, in[0], (int)axis, off, sizes[i], squeeze);
    rc = !e.node && !e.k ? -1 : seq_insert(out->seq, i, e);
  }
  free(sizes);
  return rc;
}

/* ---- ConcatFromSequence ---------------------------------------------------------------- */

/* The concat of parts[lo, hi) along axis, as a balanced tree of pairs. */
static nv_node *concat_tree(ox_ctx *x, nv_node **parts, int lo, int hi, int64_t axis) {
  if (hi - lo == 1) return parts[lo];
  int mid = lo + (hi - lo) / 2;
  nv_node *pair[2] = {concat_tree(x, parts, lo, mid, axis), concat_tree(x, parts, mid, hi, axis)};
  nv_node at = {.axis = axis};
  return pair[0] && pair[1] ? ox_add(x, NV_OP_CONCAT, 2, pair, &at) : NULL;
}

/* Element e as a node, with a new axis of 1 at axis when stacking. */
static nv_node *concat_part(ox_ctx *x, ox_val e, bool stack, int64_t axis) {
  nv_node *n = ox_node(x, e);
  if (!n || !stack) return n;
  if (n->rank + 1 > NOVA_MAX_RANK) {
    ox_err(x, "stacking rank-%d tensors gives more than %d dimensions", n->rank, NOVA_MAX_RANK);
    return NULL;
  }
  int64_t s[NOVA_MAX_RANK];
  for (int k = 0, m = 0; k <= n->rank; k++) s[k] = k == axis ? 1 : n->shape[m++];
  return ox_reshape(x, n, n->rank + 1, s);
}

/* Elements may differ only in their length along axis (not at all when
 * stacking: axis is then the new one). */
static int same_shapes(ox_ctx *x, const ox_seq *s, int64_t axis, bool stack) {
  int r = ox_val_rank(s->v[0]);
  const int64_t *s0 = ox_val_shape(s->v[0]);
  for (int i = 1; i < s->n; i++) {
    const int64_t *si = ox_val_shape(s->v[i]);
    bool same = ox_val_rank(s->v[i]) == r;
    for (int k = 0; same && k < r; k++) same = si[k] == s0[k] || (!stack && k == axis);
    if (!same)
      return ox_err(x, "element %d is %s, element 0 is %s: %s", i,
                    fe_shape_str((char[160]){0}, 160, ox_val_rank(s->v[i]), si), fe_shape_str((char[160]){0}, 160, r, s0),
                    stack ? "stacking takes equal shapes" : "they may differ along the axis only");
  }
  return 0;
}

static int cv_concat_from_sequence(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  ox_seq *s = seq_operand(x, in, nin, 0);
  if (!s || ox_need(x, in, nin, 1, 1)) return -1;
  if (!ox_attr(x, "axis")) return ox_err(x, "the attribute axis is required");
  if (!s->n) return ox_err(x, "the sequence is empty: there is nothing to concatenate");
  bool stack = ox_attr_i(x, "new_axis", 0) == 1, known = true;
  int64_t axis = ox_attr_i(x, "axis", 0);
  if (ox_norm_axis(x, &axis, ox_val_rank(s->v[0]) + stack) || same_shapes(x, s, axis, stack)) return -1;
  nv_node **parts = nv_xmalloc((size_t)s->n * sizeof *parts);
  if (!parts) return -1;
  int mark = x->g->nnodes, rc = 0;
  for (int i = 0; i < s->n && !rc; i++) {
    known &= s->v[i].k != NULL;
    if (!(parts[i] = concat_part(x, s->v[i], stack, axis))) rc = -1;
  }
  if (!rc) rc = ox_set_out(out, concat_tree(x, parts, 0, s->n, axis));
  free(parts);
  /* every element known: the result is known too (and folding goes on) */
  if (!rc && known && ox_eval_known(x, mark, out, nout)) fe_graph_truncate(x->g, mark);
  return rc;
}

const ox_op_entry ox_seq_ops[] = {
    {"SequenceEmpty", cv_sequence_empty},       {"SequenceConstruct", cv_sequence_construct},
    {"SequenceInsert", cv_sequence_insert},     {"SequenceErase", cv_sequence_erase},
    {"SequenceAt", cv_sequence_at},             {"SequenceLength", cv_sequence_length},
    {"SplitToSequence", cv_split_to_sequence},  {"ConcatFromSequence", cv_concat_from_sequence},
};
const size_t ox_seq_nops = sizeof ox_seq_ops / sizeof *ox_seq_ops;
