/* onnx_einsum.c: ONNX Einsum -> nova nodes.
 *
 * The equation is parsed into one label per axis (an ellipsis becomes
 * labels of its own, right-aligned across the operands); a label repeated
 * in one operand takes its diagonal.  Two operands are contracted with one
 * batched matmul: the labels of both that the output keeps are the batch,
 * those of both that it drops are the contraction, the others the rows and
 * columns.  Any other form is written as a broadcast product of every
 * operand over all labels, summed over those the output drops.
 */
#include <ctype.h>
#include <string.h>

#include "onnx.h"

#define MAXL 16  /* labels in one equation */

typedef struct term {
  nv_node *n;
  int nl;
  char l[NOVA_MAX_RANK]; /* the label of each axis */
} term;

/* Labels of one term; the ellipsis becomes the last e of E labels '0'.. */
static int parse_term(ox_ctx *x, const char *s, size_t len, int rank, int E, char *l) {
  int nl = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '.') {
      if (i + 2 >= len + 0 || strncmp(s + i, "...", 3)) return ox_err(x, "a malformed ellipsis in the equation");
      int named = 0;
      for (size_t j = 0; j < len; j++) named += isalpha((unsigned char)s[j]) != 0;
      int e = rank < 0 ? E : rank - named;
      if (e < 0 || e > E) return ox_err(x, "the ellipsis does not fit the operand's rank");
      for (int k = E - e; k < E; k++) l[nl++] = (char)('0' + k);
      i += 2;
    } else if (isalpha((unsigned char)s[i])) {
      if (nl >= NOVA_MAX_RANK) return ox_err(x, "a term has more than %d labels", NOVA_MAX_RANK);
      l[nl++] = s[i];
    } else if (s[i] != ' ')
      return ox_err(x, "unexpected '%c' in the equation", s[i]);
  }
  return nl;
}

/* The diagonal over repeated labels of t. */
static int diagonal(ox_ctx *x, term *t) {
  for (int a = 0; a < t->nl; a++)
    for (int b = a + 1; b < t->nl; b++) {
      if (t->l[a] != t->l[b]) continue;
      int64_t n = t->n->shape[a], s[NOVA_MAX_RANK];
      if (t->n->shape[b] != n) return ox_err(x, "label '%c' has sizes %lld and %lld", t->l[a], (long long)n, (long long)t->n->shape[b]);
      for (int i = 0; i < t->nl; i++) s[i] = i == a || i == b ? n : 1;
      ox_tensor *eye = ox_tensor_new(t->n->dtype, t->nl, s);
      if (!eye) return -1;
      for (int64_t i = 0; i < n; i++) ox_set(eye, i * n + i, 1, 1); /* the two axes are the only non-1 dims */
      nv_node *e = ox_N(x, (ox_val){.k = eye, .present = true});
      ox_tensor_free(eye);
      int64_t ax = b;
      t->n = ox_reduce(x, NV_OP_REDUCE_SUM, ox_op2(x, NV_OP_MUL, t->n, e), 1, &ax, false);
      if (!t->n) return -1;
      memmove(t->l + b, t->l + b + 1, (size_t)(t->nl - b - 1));
      t->nl--;
      b--;
    }
  return 0;
}

static int find(const char *l, int n, char c) {
  for (int i = 0; i < n; i++)
    if (l[i] == c) return i;
  return -1;
}

/* t transposed to the labels `order` (a superset) with 1s for those it lacks. */
static nv_node *align(ox_ctx *x, const term *t, const char *order, int n) {
  int64_t perm[NOVA_MAX_RANK], s[NOVA_MAX_RANK];
  int k = 0;
  for (int i = 0; i < n; i++) {
    int p = find(t->l, t->nl, order[i]);
    if (p >= 0) perm[k++] = p;
  }
  bool id = true;
  for (int i = 0; i < k; i++) id &= perm[i] == i;
  nv_node *r = id ? t->n : ox_transpose(x, t->n, perm);
  for (int i = 0; i < n; i++) {
    int p = find(t->l, t->nl, order[i]);
    s[i] = p >= 0 ? t->n->shape[p] : 1;
  }
  return ox_reshape(x, r, n, s);
}

/* A @ B over the label groups: batch, rows (A only), contracted, columns (B only). */
static nv_node *contract2(ox_ctx *x, term *A, term *B, const char *outl, int no) {
  if (!fe_dtype_is_float(A->n->dtype) || A->n->dtype != B->n->dtype) return NULL; /* the general path */
  char batch[MAXL], rows[MAXL], cols[MAXL], red[MAXL];
  int nb = 0, nr = 0, nc = 0, nk = 0;
  int64_t Bt = 1, M = 1, N = 1, Kd = 1, sz[128] = {0};
  for (int i = 0; i < A->nl; i++) sz[(unsigned char)A->l[i]] = A->n->shape[i];
  for (int i = 0; i < B->nl; i++) {
    int64_t d = B->n->shape[i], *p = &sz[(unsigned char)B->l[i]];
    if (*p && *p != d) return NULL; /* broadcasting sizes: the general path */
    *p = d;
  }
  for (int i = 0; i < A->nl; i++) {
    char c = A->l[i];
    bool inb = find(B->l, B->nl, c) >= 0, ino = find(outl, no, c) >= 0;
    if (inb && ino) batch[nb++] = c, Bt *= sz[(unsigned char)c];
    else if (inb) red[nk++] = c, Kd *= sz[(unsigned char)c];
    else rows[nr++] = c, M *= sz[(unsigned char)c];
  }
  for (int i = 0; i < B->nl; i++)
    if (find(A->l, A->nl, B->l[i]) < 0) cols[nc++] = B->l[i], N *= sz[(unsigned char)B->l[i]];
  char oa[MAXL], ob[MAXL], oc[MAXL];
  memcpy(oa, batch, (size_t)nb), memcpy(oa + nb, rows, (size_t)nr), memcpy(oa + nb + nr, red, (size_t)nk);
  memcpy(ob, batch, (size_t)nb), memcpy(ob + nb, red, (size_t)nk), memcpy(ob + nb + nk, cols, (size_t)nc);
  memcpy(oc, batch, (size_t)nb), memcpy(oc + nb, rows, (size_t)nr), memcpy(oc + nb + nr, cols, (size_t)nc);
  if (nb + nr + nc > NOVA_MAX_RANK) return NULL;
  nv_node *a = ox_reshape(x, align(x, A, oa, nb + nr + nk), 3, (int64_t[]){Bt, M, Kd});
  nv_node *b = ox_reshape(x, align(x, B, ob, nb + nk + nc), 3, (int64_t[]){Bt, Kd, N});
  nv_node *p = ox_op2(x, NV_OP_MATMUL, a, b);
  int64_t s[NOVA_MAX_RANK];
  for (int i = 0; i < nb + nr + nc; i++) s[i] = sz[(unsigned char)oc[i]];
  term r = {.n = ox_reshape(x, p, nb + nr + nc, s), .nl = nb + nr + nc};
  memcpy(r.l, oc, (size_t)r.nl);
  return r.n ? align(x, &r, outl, no) : NULL;
}

static int cv_einsum(ox_ctx *x, ox_val *in, int nin, ox_val *out, int nout) {
  (void)nout;
  if (ox_need(x, in, nin, 1, -1)) return -1;
  char buf[512], eq[512];
  snprintf(eq, sizeof eq, "%s", ox_attr_s(x, "equation", "", buf, sizeof buf));
  char *arrow = strstr(eq, "->");
  size_t lhs_len = arrow ? (size_t)(arrow - eq) : strlen(eq);
  if (nin > 8) return ox_err(x, "at most 8 operands");
  term t[8];
  /* the ellipsis' length: the most dims any operand gives it */
  int E = 0;
  const char *p = eq;
  for (int i = 0; i < nin; i++) {
    t[i].n = ox_N(x, in[i]);
    if (!t[i].n) return -1;
    const char *q = memchr(p, ',', lhs_len - (size_t)(p - eq));
    size_t len = q ? (size_t)(q - p) : lhs_len - (size_t)(p - eq);
    if ((i < nin - 1) != (q != NULL)) return ox_err(x, "the equation has another number of terms than the %d inputs", nin);
    int named = 0;
    for (size_t j = 0; j < len; j++) named += isalpha((unsigned char)p[j]) != 0;
    if (memmem(p, len, "...", 3) && t[i].n->rank - named > E) E = t[i].n->rank - named;
    p = q ? q + 1 : p;
  }
  p = eq;
  for (int i = 0; i < nin; i++) {
    const char *q = memchr(p, ',', lhs_len - (size_t)(p - eq));
    size_t len = q ? (size_t)(q - p) : lhs_len - (size_t)(p - eq);
    t[i].nl = parse_term(x, p, len, t[i].n->rank, E, t[i].l);
    if (t[i].nl < 0) return -1;
    if (t[i].nl != t[i].n->rank) return ox_err(x, "term %d has %d labels for an input of rank %d", i, t[i].nl, t[i].n->rank);
    if (diagonal(x, &t[i])) return -1;
    p = q ? q + 1 : p;
  }
  char outl[MAXL];
  int no = 0;
  if (arrow) {
    if ((no = parse_term(x, arrow + 2, strlen(arrow + 2), -1, E, outl)) < 0) return -1;
  } else { /* the ellipsis, then the labels seen once, in alphabetical order */
    for (int k = 0; k < E; k++) outl[no++] = (char)('0' + k);
    for (int c = 'A'; c <= 'z'; c++) {
      int cnt = 0;
      for (int i = 0; i < nin; i++) cnt += find(t[i].l, t[i].nl, (char)c) >= 0;
      if (cnt == 1 && isalpha(c)) outl[no++] = (char)c;
    }
  }
  /* every label: the output's, then the contracted ones */
  char all[MAXL];
  int na = no;
  memcpy(all, outl, (size_t)no);
  for (int i = 0; i < nin; i++)
    for (int j = 0; j < t[i].nl; j++)
      if (find(all, na, t[i].l[j]) < 0) {
        if (na >= MAXL) return ox_err(x, "more than %d labels", MAXL);
        all[na++] = t[i].l[j];
      }
  for (int i = 0; i < no; i++) {
    if (find(outl, i, outl[i]) >= 0) return ox_err(x, "output label '%c' repeated", outl[i]);
    bool seen = false;
    for (int k = 0; k < nin && !seen; k++) seen = find(t[k].l, t[k].nl, outl[i]) >= 0;
    if (!seen) return ox_err(x, "output label '%c' is in no input", outl[i]);
  }
  /* labels in one operand only and not kept: summed away first */
  for (int i = 0; i < nin; i++)
    for (int j = t[i].nl - 1; j >= 0; j--) {
      char c = t[i].l[j];
      bool elsewhere = find(outl, no, c) >= 0;
      for (int k = 0; k < nin && !elsewhere; k++) elsewhere = k != i && find(t[k].l, t[k].nl, c) >= 0;
      if (elsewhere) continue;
      int64_t ax = j;
      t[i].n = ox_reduce(x, NV_OP_REDUCE_SUM, t[i].n, 1, &ax, false);
      if (!t[i].n) return -1;
      memmove(t[i].l + j, t[i].l + j + 1, (size_t)(t[i].nl - j - 1));
      t[i].nl--;
    }
  if (nin == 1) return ox_set_out(out, align(x, &t[0], outl, no));
  if (nin == 2) {
    nv_node *r = contract2(x, &t[0], &t[1], outl, no);
    if (r || nv_diag_count(x->d)) return ox_set_out(out, r);
  }
  na = no;
  for (int i = 0; i < nin; i++)
    for (int j = 0; j < t[i].nl; j++)
      if (find(all, na, t[i].l[j]) < 0) all[na++] = t[i].l[j];
  if (na > NOVA_MAX_RANK) return ox_err(x, "this equation spans %d labels; at most %d are supported", na, NOVA_MAX_RANK);
  nv_node *prod = align(x, &t[0], all, na);
  for (int i = 1; i < nin && prod; i++) prod = ox_op2(x, NV_OP_MUL, prod, align(x, &t[i], all, na));
  if (!prod) return -1;
  if (fe_numel(prod) > (INT64_C(1) << 26)) return ox_err(x, "the operands' product has %lld elements; at most 2^26", (long long)fe_numel(prod));
  int64_t axes[NOVA_MAX_RANK];
  for (int i = no; i < na; i++) axes[i - no] = i;
  return ox_set_out(out, na > no ? ox_reduce(x, NV_OP_REDUCE_SUM, prod, na - no, axes, false) : prod);
}

const ox_op_entry ox_einsum_ops[] = {{"Einsum", cv_einsum}};
const size_t ox_einsum_nops = 1;
