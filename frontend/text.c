/* text.c: the .nova textual graph format (grammar in man/nova-format.5).
 *
 *   file   := { stmt NEWLINE }
 *   stmt   := 'input' NAME ':' type | 'label' NAME ':' type
 *           | 'param' NAME ':' type '=' init | 'const' NAME ':' type '=' init | 'seed' INT
 *           | 'precision' ('fp32' | 'bf16' | 'fp16' | 'tf32')
 *           | NAME '=' expr | 'output' NAME [ '=' expr ]
 *   type   := DTYPE '[' [ dim { ',' dim } ] ']'      dim := INT | NAME (bound by --dim)
 *   expr   := term { ('+' | '-') term }
 *   term   := unary { ('*' | '/' | '@') unary }
 *   unary  := '-' unary | primary
 *   primary:= NUMBER | NAME | NAME '(' [ arg { ',' arg } ] ')' | '(' expr ')'
 *   arg    := expr | NAME '=' ( number | '[' [ dim { ',' dim } ] ']' )
 *
 * Newlines end statements except inside parentheses and brackets; '#' starts
 * a comment.  A recursive-descent parser over a one-token lookahead lexer;
 * every node gets the location of its operator or call.
 */
#include "../support/util.h"
#include "frontend.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum tok_kind { T_EOF, T_NL, T_NAME, T_NUM, T_STR, T_PUNCT, T_BAD } tok_kind;

typedef struct tok {
  tok_kind kind;
  nv_loc loc;
  char text[256];   /* NAME, STR, PUNCT (one char) */
  double num;
  int64_t inum;
  bool is_int;
} tok;

/* A parsed expression: a node, or a numeric literal not yet given a dtype. */
typedef struct ev {
  nv_node *node;
  double lit;
  bool is_lit;
  nv_loc loc;
} ev;

typedef struct sym {
  char *name;
  nv_node *node;
} sym;

typedef struct parser {
  nv_diag *d;
  nv_graph *g;
  const char *file, *src, *end, *p, *basedir;
  int line, col, depth;   /* depth: open ( and [ */
  int nest;               /* expression recursion depth */
  tok t;                  /* current token */
  bool failed;
  int nsym, capsym;
  sym *syms;
  int *symtab;            /* open addressing on the name's hash: index + 1, 0 empty */
  size_t nslot;           /* a power of two, at least twice capsym */
  fe_dim_binding *dims;
  int ndims;
} parser;

/* ---- lexer ---------------------------------------------------------- */

static void lex_error(parser *P, nv_loc loc, const char *fmt, const char *arg) {
  nv_error(P->d, loc, fmt, arg);
  P->failed = true;
}

static void advance_char(parser *P) {
  if (*P->p == '\n') {
    P->line++;
    P->col = 1;
  } else
    P->col++;
  P->p++;
}

static void next(parser *P) {
  tok *t = &P->t;
  for (;;) {
    while (P->p < P->end && (*P->p == ' ' || *P->p == '\t' || *P->p == '\r' ||
                             (*P->p == '\n' && P->depth > 0)))
      advance_char(P);
    if (P->p < P->end && *P->p == '#') {
      while (P->p < P->end && *P->p != '\n') advance_char(P);
      continue;
    }
    break;
  }
  memset(t, 0, sizeof *t);
  t->loc = (nv_loc){P->file, P->line, P->col};
  if (P->p >= P->end) {
    t->kind = T_EOF;
    return;
  }
  unsigned char c = (unsigned char)*P->p;
  if (c == '\n') {
    t->kind = T_NL;
    advance_char(P);
    return;
  }
  if (isalpha(c) || c == '_') {
    size_t n = 0;
    while (P->p < P->end && (isalnum((unsigned char)*P->p) || *P->p == '_' || *P->p == '.')) {
      if (n < sizeof t->text - 1) t->text[n++] = *P->p;
      else {
        lex_error(P, t->loc, "name is longer than 255 characters%s", "");
        t->kind = T_BAD;
        return;
      }
      advance_char(P);
    }
    t->kind = T_NAME;
    return;
  }
  if (isdigit(c) || (c == '.' && P->p + 1 < P->end && isdigit((unsigned char)P->p[1]))) {
    char buf[64];
    size_t n = 0;
    bool is_int = true;
    while (P->p < P->end && n < sizeof buf - 1) {
      char ch = *P->p;
      bool exp_sign = (ch == '+' || ch == '-') && n > 0 && (buf[n - 1] == 'e' || buf[n - 1] == 'E');
      if (!(isalnum((unsigned char)ch) || ch == '.' || exp_sign)) break;
      if (!isdigit((unsigned char)ch)) is_int = false;
      buf[n++] = ch;
      advance_char(P);
    }
    buf[n] = 0;
    char *e;
    errno = 0;
    t->kind = T_NUM;
    t->is_int = is_int;
    if (is_int) {
      long long v = strtoll(buf, &e, 10);
      if (errno == ERANGE) {
        lex_error(P, t->loc, "integer '%s' is too large", buf);
        t->kind = T_BAD;
      }
      t->inum = v;
      t->num = (double)v;
    } else {
      t->num = strtod(buf, &e);
      if (*e || errno == ERANGE || !isfinite(t->num) || strpbrk(buf, "xXpP")) {
        lex_error(P, t->loc, "malformed number '%s'", buf);
        t->kind = T_BAD;
      }
    }
    return;
  }
  if (c == '"') {
    advance_char(P);
    size_t n = 0;
    bool too_long = false;
    while (P->p < P->end && *P->p != '"' && *P->p != '\n') {
      if (n < sizeof t->text - 1) t->text[n++] = *P->p;
      else too_long = true;
      advance_char(P);
    }
    if (too_long) {
      lex_error(P, t->loc, "string is longer than 255 characters%s", "");
      t->kind = T_BAD;
      return;
    }
    if (P->p >= P->end || *P->p != '"') {
      lex_error(P, t->loc, "unterminated string%s", "");
      t->kind = T_BAD;
      return;
    }
    advance_char(P);
    t->kind = T_STR;
    return;
  }
  if (strchr("()[],:=+-*/@", c) && c) {
    t->kind = T_PUNCT;
    t->text[0] = (char)c;
    if (c == '(' || c == '[') P->depth++;
    if ((c == ')' || c == ']') && P->depth > 0) P->depth--;
    advance_char(P);
    return;
  }
  char what[32];
  if (c >= 32 && c < 127)
    snprintf(what, sizeof what, "'%c'", c);
  else
    snprintf(what, sizeof what, "byte 0x%02x", c);
  lex_error(P, t->loc, "unexpected character %s", what);
  t->kind = T_BAD;
  advance_char(P); /* always make progress */
}

static bool is_punct(parser *P, char c) { return P->t.kind == T_PUNCT && P->t.text[0] == c; }
static bool is_name(parser *P, const char *s) { return P->t.kind == T_NAME && strcmp(P->t.text, s) == 0; }

static const char *tok_desc(const tok *t) {
  switch (t->kind) {
  case T_EOF: return "end of file";
  case T_NL: return "end of line";
  case T_NUM: return "a number";
  case T_STR: return "a string";
  case T_BAD: return "an invalid token";
  default: return t->text;
  }
}

static bool expect(parser *P, char c, const char *context) {
  if (is_punct(P, c)) {
    next(P);
    return true;
  }
  if (P->t.kind != T_BAD) {
    nv_error(P->d, P->t.loc, "expected '%c' %s, found '%s'", c, context, tok_desc(&P->t));
    P->failed = true;
  }
  return false;
}

static bool expect_name(parser *P, char *out, const char *context) {
  if (P->t.kind == T_NAME) {
    strcpy(out, P->t.text);
    next(P);
    return true;
  }
  if (P->t.kind != T_BAD) {
    nv_error(P->d, P->t.loc, "expected a name %s, found '%s'", context, tok_desc(&P->t));
    P->failed = true;
  }
  return false;
}

/* ---- symbols -------------------------------------------------------- */

static size_t sym_slot(const parser *P, const char *name) {
  return (size_t)nv_fnv1a64(1469598103934665603ull, name, strlen(name)) & (P->nslot - 1);
}

static sym *find_sym(parser *P, const char *name) {
  if (!P->nslot) return NULL;
  for (size_t j = sym_slot(P, name); P->symtab[j]; j = (j + 1) & (P->nslot - 1))
    if (strcmp(P->syms[P->symtab[j] - 1].name, name) == 0) return &P->syms[P->symtab[j] - 1];
  return NULL;
}

static void index_sym(parser *P, int i) {
  size_t j = sym_slot(P, P->syms[i].name);
  while (P->symtab[j]) j = (j + 1) & (P->nslot - 1);
  P->symtab[j] = i + 1;
}

static bool reserved(const char *name) {
  static const char *kw[] = {"input", "label", "param", "const", "output", "seed", "precision"};
  for (size_t i = 0; i < sizeof kw / sizeof kw[0]; i++)
    if (strcmp(kw[i], name) == 0) return true;
  return nv_op_lookup(name) != NV_OP_COUNT || fe_dtype_parse(name) != 0;
}

static bool define(parser *P, const char *name, nv_node *n, nv_loc loc) {
  sym *old = find_sym(P, name);
  if (old && !old->node) { /* poisoned by a failed definition: replace quietly */
    old->node = n;
    if (n && !n->name) n->name = nv_xstrdup(name);
    return n != NULL;
  }
  if (old) {
    nv_error(P->d, loc, "'%s' is already defined", name);
    P->failed = true;
    return false;
  }
  if (reserved(name)) {
    nv_error(P->d, loc, "'%s' is a reserved word and cannot name a value", name);
    P->failed = true;
    return false;
  }
  if (P->nsym == P->capsym) {
    int cap = P->capsym ? 2 * P->capsym : 32;
    sym *s = nv_xrealloc(P->syms, (size_t)cap * sizeof *s);
    if (!s) return false;
    P->syms = s;
    P->capsym = cap;
    free(P->symtab);
    P->nslot = 4 * (size_t)cap;
    P->symtab = nv_xcalloc(P->nslot, sizeof *P->symtab);
    for (int i = 0; i < P->nsym; i++) index_sym(P, i);
  }
  P->syms[P->nsym] = (sym){nv_xstrdup(name), n};
  index_sym(P, P->nsym++);
  if (n && !n->name) n->name = nv_xstrdup(name);
  return n != NULL;
}

/* ---- expressions ---------------------------------------------------- */

/* Deeper expressions than this are refused rather than risking the stack. */
#define MAX_NEST 200

static ev parse_expr(parser *P);
static ev parse_call_args(parser *P, nv_op op, nv_loc loc);

static nv_node *materialize(parser *P, ev v, nova_dtype dt) {
  if (!v.is_lit) return v.node;
  nv_node a = {0};
  a.value = v.lit;
  a.dtype = dt;
  a.rank = 0;
  nv_node *n = fe_graph_add(P->g, P->d, NV_OP_CONSTANT, 0, NULL, &a, v.loc);
  if (!n) P->failed = true;
  else n->init = (nv_init){.kind = NV_INIT_CONST, .a = v.lit};
  return n;
}

static ev fail_ev(parser *P) {
  P->failed = true;
  return (ev){0};
}

static ev binary(parser *P, char op, ev a, ev b, nv_loc loc) {
  if (P->failed) return (ev){0};
  if (a.is_lit && b.is_lit) {
    double r = op == '+' ? a.lit + b.lit : op == '-' ? a.lit - b.lit : op == '*' ? a.lit * b.lit
             : b.lit != 0 ? a.lit / b.lit : NAN;
    if (op == '@' || !isfinite(r)) {
      nv_error(P->d, loc, op == '@' ? "'@' needs tensor operands" : "constant expression is not finite");
      return fail_ev(P);
    }
    return (ev){.lit = r, .is_lit = true, .loc = a.loc};
  }
  nova_dtype dt = a.is_lit ? b.node->dtype : a.node->dtype;
  ev lit = a.is_lit ? a : b;
  if (lit.is_lit && fe_dtype_is_int(dt) && lit.lit != (double)(int64_t)lit.lit) {
    nv_error(P->d, lit.loc, "the number %g is not an integer, but the other operand is %s", lit.lit, fe_dtype_name(dt));
    return fail_ev(P);
  }
  nv_node *in[2] = {materialize(P, a, dt), materialize(P, b, dt)};
  if (!in[0] || !in[1]) return fail_ev(P);
  nv_op o = op == '+' ? NV_OP_ADD : op == '-' ? NV_OP_SUB : op == '*' ? NV_OP_MUL
          : op == '/' ? NV_OP_DIV : NV_OP_MATMUL;
  nv_node *n = fe_graph_add(P->g, P->d, o, 2, in, NULL, loc);
  if (!n) return fail_ev(P);
  return (ev){.node = n, .loc = a.loc};
}

/* Keyword arguments each op accepts. */
static const char *allowed_attrs(nv_op op) {
  switch (op) {
  case NV_OP_SOFTMAX: case NV_OP_LOG_SOFTMAX: case NV_OP_CONCAT: case NV_OP_GATHER: case NV_OP_GATHER_ELEMENTS:
    return "axis";
  case NV_OP_CUMSUM: case NV_OP_SCATTER_ELEMENTS: return "axis mode";
  case NV_OP_SCATTER_ND: return "mode";
  case NV_OP_GATHER_ND: return "batch_dims";
  case NV_OP_LAYER_NORM: return "eps";
  case NV_OP_ATTENTION: return "scale softcap";
  case NV_OP_REDUCE_SUM: case NV_OP_REDUCE_MEAN: case NV_OP_REDUCE_MAX: case NV_OP_REDUCE_MIN:
  case NV_OP_REDUCE_PROD: return "axes keepdims";
  case NV_OP_RESHAPE: case NV_OP_BROADCAST: return "shape";
  case NV_OP_TRANSPOSE: return "perm";
  case NV_OP_CAST: return "to";
  case NV_OP_CONV: return "strides pads dilations groups";
  case NV_OP_MAX_POOL: return "kernel strides pads dilations ceil_mode";
  case NV_OP_AVG_POOL: return "kernel strides pads dilations count_include_pad ceil_mode";
  case NV_OP_SLICE: return "axis start end step";
  case NV_OP_RMS_NORM: return "eps";
  case NV_OP_ROTARY: return "interleaved";
  case NV_OP_ALL_REDUCE: return "bucket";
  case NV_OP_REDUCE_SCATTER:
  case NV_OP_ALL_GATHER: return "bucket world";
  case NV_OP_SHARD: return "world";
  default: return "";
  }
}

static bool word_in(const char *w, const char *list) {
  size_t n = strlen(w);
  for (const char *p = list; (p = strstr(p, w)); p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return true;
  return false;
}

static bool parse_signed_number(parser *P, double *v, bool *is_int, int64_t *iv) {
  bool neg = false;
  if (is_punct(P, '-')) {
    neg = true;
    next(P);
  }
  if (P->t.kind != T_NUM) {
    if (P->t.kind != T_BAD) nv_error(P->d, P->t.loc, "expected a number, found '%s'", tok_desc(&P->t));
    P->failed = true;
    return false;
  }
  *v = neg ? -P->t.num : P->t.num;
  if (is_int) *is_int = P->t.is_int;
  if (iv) *iv = neg ? -P->t.inum : P->t.inum;
  next(P);
  return true;
}

static bool parse_int_value(parser *P, const char *key, int64_t *out) {
  double v;
  bool is_int;
  nv_loc loc = P->t.loc;
  if (!parse_signed_number(P, &v, &is_int, out)) return false;
  if (!is_int) {
    nv_error(P->d, loc, "'%s' must be an integer", key);
    P->failed = true;
    return false;
  }
  return true;
}

/* key=value inside a call; sets the field of A it names. */
static bool parse_attr(parser *P, nv_op op, const char *key, nv_loc kloc, nv_node *a, bool *seen_end) {
  if (!word_in(key, allowed_attrs(op))) {
    const char *al = allowed_attrs(op);
    nv_error(P->d, kloc, "%s has no attribute '%s'%s%s", nv_op_name(op), key,
             *al ? "; it takes: " : "", al);
    P->failed = true;
    return false;
  }
  if (!strcmp(key, "kernel") || !strcmp(key, "strides") || !strcmp(key, "pads") || !strcmp(key, "dilations")) {
    int64_t *dst = !strcmp(key, "kernel") ? a->kernel : !strcmp(key, "strides") ? a->strides
                 : !strcmp(key, "pads") ? a->pads : a->dilations;
    int max = !strcmp(key, "pads") ? 6 : 3, n = 0;
    if (!expect(P, '[', "to start a list")) return false;
    while (!is_punct(P, ']')) {
      if (n == max) {
        nv_error(P->d, P->t.loc, "'%s' has more than %d entries", key, max);
        P->failed = true;
        return false;
      }
      if (!parse_int_value(P, key, &dst[n++])) return false;
      if (!is_punct(P, ']') && !expect(P, ',', "between list entries")) return false;
    }
    next(P);
    if (!strcmp(key, "pads") && n % 2) {
      nv_error(P->d, kloc, "pads lists the begin pads, then the end pads: an even number of entries");
      P->failed = true;
      return false;
    }
    if (!strcmp(key, "pads") && n < 6) { /* [b..., e...] with n/2 spatial dims: move the ends to slot 3.. later */
      int64_t tmp[6] = {0};
      memcpy(tmp, dst, (size_t)n * sizeof *dst);
      memset(dst, 0, 6 * sizeof *dst);
      for (int i = 0; i < n / 2; i++) dst[i] = tmp[i], dst[3 + i] = tmp[n / 2 + i];
      a->nspatial = n / 2; /* checked against the input's rank */
    }
    return true;
  }
  if (strcmp(key, "axes") == 0 || strcmp(key, "shape") == 0 || strcmp(key, "perm") == 0) {
    if (!expect(P, '[', "to start a list")) return false;
    a->nlist = 0;
    while (!is_punct(P, ']')) {
      if (a->nlist == NOVA_MAX_RANK) {
        nv_error(P->d, P->t.loc, "'%s' has more than %d entries", key, NOVA_MAX_RANK);
        P->failed = true;
        return false;
      }
      if (P->t.kind == T_NAME) { /* a symbolic dimension */
        fe_dim_binding *b = NULL;
        for (int i = 0; i < P->ndims; i++)
          if (strcmp(P->dims[i].name, P->t.text) == 0) b = &P->dims[i];
        if (!b) {
          nv_error(P->d, P->t.loc, "symbolic dimension '%s' is not bound; pass --dim=%s=N", P->t.text, P->t.text);
          P->failed = true;
          return false;
        }
        b->used = true;
        a->list[a->nlist++] = b->value;
        next(P);
      } else if (!parse_int_value(P, key, &a->list[a->nlist++]))
        return false;
      if (!is_punct(P, ']') && !expect(P, ',', "between list entries")) return false;
    }
    next(P);
    return true;
  }
  if (strcmp(key, "to") == 0) {
    nv_loc vloc = P->t.loc;
    char name[256];
    if (!expect_name(P, name, "for the target dtype")) return false;
    a->to = fe_dtype_parse(name);
    if (!a->to && strcmp(name, "bool") == 0) a->to = NOVA_DTYPE_BOOL;
    if (!a->to) {
      nv_error(P->d, vloc, "unknown dtype '%s'; expected f32, f64, f16, bf16, i8 to i64, u8 to u64 or bool", name);
      P->failed = true;
      return false;
    }
    return true;
  }
  if (strcmp(key, "eps") == 0 || strcmp(key, "scale") == 0 || strcmp(key, "softcap") == 0) {
    double v;
    if (!parse_signed_number(P, &v, NULL, NULL)) return false;
    *(key[0] == 'e' ? &a->eps : key[1] == 'c' ? &a->scale : &a->softcap) = v;
    return true;
  }
  int64_t v;
  if (!parse_int_value(P, key, &v)) return false;
  if (strcmp(key, "axis") == 0 || strcmp(key, "batch_dims") == 0) a->axis = v;
  else if (strcmp(key, "mode") == 0) {
    if (v < 0 || v > 7) {
      nv_error(P->d, kloc, "mode must be 0 to 7 (scatter: 0 to 4, none, add, mul, max, min; cumsum: 1 exclusive + 2 "
               "reverse + 4 product)");
      P->failed = true;
      return false;
    }
    a->mode = v;
  } else if (strcmp(key, "keepdims") == 0) {
    if (v != 0 && v != 1) {
      nv_error(P->d, kloc, "keepdims must be 0 or 1");
      P->failed = true;
      return false;
    }
    a->keepdims = v;
  } else if (strcmp(key, "start") == 0) a->start = v;
  else if (strcmp(key, "end") == 0) {
    a->end = v;
    *seen_end = true;
  } else if (strcmp(key, "step") == 0) a->step = v;
  else if (strcmp(key, "groups") == 0) a->groups = v;
  else if (strcmp(key, "ceil_mode") == 0 || strcmp(key, "count_include_pad") == 0) {
    if (v != 0 && v != 1) {
      nv_error(P->d, kloc, "%s must be 0 or 1", key);
      P->failed = true;
      return false;
    }
    if (key[0] == 'c' && key[1] == 'e') a->ceil_mode = v;
    else a->count_include_pad = v;
  } else if (strcmp(key, "interleaved") == 0) {
    if (v != 0 && v != 1) {
      nv_error(P->d, kloc, "interleaved must be 0 or 1");
      P->failed = true;
      return false;
    }
    a->mode = v;
  }
  return true;
}

static ev parse_call(parser *P, nv_op op, nv_loc loc) {
  if (P->nest + 1 >= MAX_NEST) {
    nv_error(P->d, loc, "expression nested more than %d levels deep", MAX_NEST);
    return fail_ev(P);
  }
  P->nest++;
  ev r = parse_call_args(P, op, loc);
  P->nest--;
  return r;
}

static ev parse_call_args(parser *P, nv_op op, nv_loc loc) {
  nv_node a = {0};
  a.axis = (op == NV_OP_SOFTMAX || op == NV_OP_LOG_SOFTMAX) ? -1 : 0;
  a.eps = 1e-5;
  a.scale = NAN; /* attention: 1 / sqrt(head size) */
  a.step = 1;
  a.groups = 1;
  for (int i = 0; i < 3; i++) a.strides[i] = a.dilations[i] = 1;
  a.end = INT64_MAX;
  bool seen_end = false, seen_shape = false;
  nv_node *in[64];
  int nin = 0;
  next(P); /* ( */
  while (!is_punct(P, ')') && !P->failed) {
    if (P->t.kind == T_NAME) {
      /* key=value? peek by saving lexer state */
      parser save = *P;
      char key[256];
      strcpy(key, P->t.text);
      nv_loc kloc = P->t.loc;
      next(P);
      if (is_punct(P, '=')) {
        next(P);
        if (!parse_attr(P, op, key, kloc, &a, &seen_end)) return fail_ev(P);
        if (strcmp(key, "shape") == 0) seen_shape = true;
        goto sep;
      }
      *P = save;
    }
    if (nin == (int)(sizeof in / sizeof in[0])) {
      nv_error(P->d, P->t.loc, "%s: too many operands", nv_op_name(op));
      return fail_ev(P);
    }
    ev v = parse_expr(P);
    if (P->failed) return fail_ev(P);
    if (v.is_lit) {
      nv_error(P->d, v.loc, "%s: operand %d is a number; operands must be tensors", nv_op_name(op), nin);
      return fail_ev(P);
    }
    in[nin++] = v.node;
  sep:
    if (!is_punct(P, ')') && !expect(P, ',', "between arguments")) return fail_ev(P);
  }
  if (P->failed) return fail_ev(P);
  next(P); /* ) */
  (void)seen_end;
  if ((op == NV_OP_CONV || op == NV_OP_MAX_POOL || op == NV_OP_AVG_POOL) && nin >= 1 && in[0]->rank >= 3) {
    int ns = in[0]->rank - 2; /* pads were read as [b..., e...] into slots 0.. and 3.. */
    if (a.nspatial && a.nspatial != ns) {
      nv_error(P->d, loc, "pads has %d entries; the input has %d spatial dims", 2 * a.nspatial, ns);
      return fail_ev(P);
    }
    int64_t p[6];
    memcpy(p, a.pads, sizeof p);
    for (int i = 0; i < ns; i++) a.pads[i] = p[i], a.pads[ns + i] = p[3 + i];
    if (op != NV_OP_CONV && a.kernel[0] == 0) {
      nv_error(P->d, loc, "%s needs kernel=[...]", nv_op_name(op));
      return fail_ev(P);
    }
  }
  if (op == NV_OP_CAST && !a.to) {
    nv_error(P->d, loc, "cast needs a target dtype: cast(x, to=f32)");
    return fail_ev(P);
  }
  if ((op == NV_OP_RESHAPE || op == NV_OP_BROADCAST) && !seen_shape) {
    nv_error(P->d, loc, "%s needs a target shape: %s(x, shape=[...])", nv_op_name(op), nv_op_name(op));
    return fail_ev(P);
  }
  if (op == NV_OP_CONCAT && nin > 2) { /* n-ary concat: a left-leaning chain of binary ones */
    nv_node *acc = in[0];
    for (int i = 1; i < nin && acc; i++) {
      nv_node *pair[2] = {acc, in[i]};
      acc = fe_graph_add(P->g, P->d, op, 2, pair, &a, loc);
    }
    if (!acc) return fail_ev(P);
    return (ev){.node = acc, .loc = loc};
  }
  if (op == NV_OP_CONCAT && nin == 1) {
    if (in[0]->rank == 0 || a.axis < -in[0]->rank || a.axis >= in[0]->rank) {
      nv_error(P->d, loc, "concat: axis %lld is out of range for %s of rank %d", (long long)a.axis,
               in[0]->rank ? "an operand" : "a scalar operand", in[0]->rank);
      return fail_ev(P);
    }
    return (ev){.node = in[0], .loc = loc};
  }
  if (op == NV_OP_ATTENTION && nin == 3) { /* no bias: a scalar 0 */
    in[nin] = fe_graph_leaf(P->g, P->d, NV_OP_CONSTANT, NULL, in[0]->dtype, 0, NULL, loc);
    if (!in[nin++]) return fail_ev(P);
  }
  nv_node *n = fe_graph_add(P->g, P->d, op, nin, in, &a, loc);
  if (!n) return fail_ev(P);
  return (ev){.node = n, .loc = loc};
}

static ev parse_primary(parser *P) {
  tok t = P->t;
  if (t.kind == T_NUM) {
    next(P);
    return (ev){.lit = t.num, .is_lit = true, .loc = t.loc};
  }
  if (is_punct(P, '(')) {
    next(P);
    if (P->nest + 1 >= MAX_NEST) {
      nv_error(P->d, t.loc, "expression nested more than %d levels deep", MAX_NEST);
      return fail_ev(P);
    }
    P->nest++;
    ev v = parse_expr(P);
    P->nest--;
    if (P->failed) return v;
    expect(P, ')', "to close the parenthesis");
    return v;
  }
  if (t.kind == T_NAME) {
    next(P);
    if (is_punct(P, '(')) {
      nv_op op = nv_op_lookup(t.text);
      if (op == NV_OP_COUNT) {
        nv_error(P->d, t.loc, "unknown op '%s'", t.text);
        return fail_ev(P);
      }
      if (op == NV_OP_ALL_REDUCE || op == NV_OP_REDUCE_SCATTER || op == NV_OP_ALL_GATHER || op == NV_OP_SHARD) {
        nv_error(P->d, t.loc, "%s is made by novac --data-parallel, not written in a model", t.text);
        return fail_ev(P);
      }
      return parse_call(P, op, t.loc);
    }
    sym *s = find_sym(P, t.text);
    if (!s || !s->node) {
      if (!s) nv_error(P->d, t.loc, "'%s' is not defined", t.text);
      return fail_ev(P);
    }
    nv_node *n = s->node;
    return (ev){.node = n, .loc = t.loc};
  }
  if (t.kind != T_BAD)
    nv_error(P->d, t.loc, "expected an expression, found '%s'", tok_desc(&t));
  return fail_ev(P);
}

static ev parse_unary(parser *P) {
  if (P->nest >= MAX_NEST) {
    nv_error(P->d, P->t.loc, "expression nested more than %d levels deep", MAX_NEST);
    return fail_ev(P);
  }
  if (is_punct(P, '-')) {
    nv_loc loc = P->t.loc;
    next(P);
    P->nest++;
    ev v = parse_unary(P);
    P->nest--;
    if (P->failed) return v;
    if (v.is_lit) {
      v.lit = -v.lit;
      return v;
    }
    nv_node *n = fe_graph_add(P->g, P->d, NV_OP_NEG, 1, &v.node, NULL, loc);
    if (!n) return fail_ev(P);
    return (ev){.node = n, .loc = loc};
  }
  return parse_primary(P);
}

static ev parse_term(parser *P) {
  ev a = parse_unary(P);
  while (!P->failed && (is_punct(P, '*') || is_punct(P, '/') || is_punct(P, '@'))) {
    char op = P->t.text[0];
    nv_loc loc = P->t.loc;
    next(P);
    ev b = parse_unary(P);
    a = binary(P, op, a, b, loc);
  }
  return a;
}

static ev parse_expr(parser *P) {
  ev a = parse_term(P);
  while (!P->failed && (is_punct(P, '+') || is_punct(P, '-'))) {
    char op = P->t.text[0];
    nv_loc loc = P->t.loc;
    next(P);
    ev b = parse_term(P);
    a = binary(P, op, a, b, loc);
  }
  return a;
}

/* ---- statements ----------------------------------------------------- */

static bool parse_type(parser *P, nova_dtype *dt, int *rank, int64_t *shape) {
  nv_loc loc = P->t.loc;
  char name[256];
  if (!expect_name(P, name, "for the element type (f32, f64, i32, i64, ...)")) return false;
  *dt = fe_dtype_parse(name);
  if (!*dt) {
    nv_error(P->d, loc, "unknown element type '%s'; expected f32, f64, f16, bf16, i8 to i64 or u8 to u64", name);
    P->failed = true;
    return false;
  }
  if (!expect(P, '[', "after the element type")) return false;
  *rank = 0;
  while (!is_punct(P, ']')) {
    if (*rank == NOVA_MAX_RANK) {
      nv_error(P->d, P->t.loc, "more than %d dimensions", NOVA_MAX_RANK);
      P->failed = true;
      return false;
    }
    if (P->t.kind == T_NAME) {
      fe_dim_binding *b = NULL;
      for (int i = 0; i < P->ndims; i++)
        if (strcmp(P->dims[i].name, P->t.text) == 0) b = &P->dims[i];
      if (!b) {
        nv_error(P->d, P->t.loc, "symbolic dimension '%s' is not bound; pass --dim=%s=N", P->t.text,
                 P->t.text);
        P->failed = true;
        return false;
      }
      b->used = true;
      shape[(*rank)++] = b->value;
      next(P);
    } else {
      nv_loc dloc = P->t.loc;
      int64_t v;
      if (!parse_int_value(P, "a dimension", &v)) return false;
      if (v <= 0) {
        nv_error(P->d, dloc, "dimension must be positive, got %lld", (long long)v);
        P->failed = true;
        return false;
      }
      shape[(*rank)++] = v;
    }
    if (!is_punct(P, ']') && !expect(P, ',', "between dimensions")) return false;
  }
  next(P);
  return true;
}

static bool parse_init(parser *P, nv_init *init) {
  nv_loc loc = P->t.loc;
  if (P->t.kind == T_NUM || is_punct(P, '-')) {
    init->kind = NV_INIT_CONST;
    return parse_signed_number(P, &init->a, NULL, NULL);
  }
  char name[256];
  if (!expect_name(P, name, "for the initializer")) return false;
  static const struct { const char *name; nv_init_kind kind; int nargs; } inits[] = {
      {"zeros", NV_INIT_ZEROS, 0}, {"ones", NV_INIT_ONES, 0},     {"he", NV_INIT_HE, 0},
      {"xavier", NV_INIT_XAVIER, 0}, {"normal", NV_INIT_NORMAL, 1}, {"uniform", NV_INIT_UNIFORM, 2},
      {"file", NV_INIT_FILE, -1}, {"causal_mask", NV_INIT_CAUSAL, 1}};
  for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++) {
    if (strcmp(name, inits[i].name) != 0) continue;
    init->kind = inits[i].kind;
    if (inits[i].nargs == 0) return true;
    if (!expect(P, '(', "after the initializer's name")) return false;
    if (inits[i].nargs < 0) {
      if (P->t.kind != T_STR) {
        nv_error(P->d, P->t.loc, "file() takes a quoted path");
        P->failed = true;
        return false;
      }
      const char *rel = P->t.text;
      size_t n = strlen(P->basedir) + strlen(rel) + 2;
      init->path = nv_xmalloc(n);
      if (!init->path) return false;
      if (rel[0] == '/' || !*P->basedir) snprintf(init->path, n, "%s", rel);
      else snprintf(init->path, n, "%s/%s", P->basedir, rel);
      next(P);
    } else {
      if (!parse_signed_number(P, &init->a, NULL, NULL)) return false;
      if (inits[i].nargs == 2 && (!expect(P, ',', "between arguments") ||
                                  !parse_signed_number(P, &init->b, NULL, NULL)))
        return false;
      if (init->kind == NV_INIT_NORMAL && !(init->a >= 0)) {
        nv_error(P->d, loc, "normal(std): std must be >= 0");
        P->failed = true;
        return false;
      }
      if (init->kind == NV_INIT_UNIFORM && !(init->a < init->b)) {
        nv_error(P->d, loc, "uniform(a, b): needs a < b");
        P->failed = true;
        return false;
      }
    }
    return expect(P, ')', "to close the initializer");
  }
  nv_error(P->d, loc, "unknown initializer '%s'; expected zeros, ones, NUMBER, normal(std), "
           "uniform(a,b), he, xavier or file(\"path\")", name);
  P->failed = true;
  return false;
}

/* Marks NAME as defined-but-failed so its uses raise no second error. */
static void poison(parser *P, const char *name) {
  if (!find_sym(P, name) && !reserved(name)) define(P, name, NULL, (nv_loc){0});
}

static void parse_decl(parser *P, nv_op op, nova_role role) {
  next(P);
  char name[256];
  nv_loc loc = P->t.loc;
  nova_dtype dt;
  int rank;
  int64_t shape[NOVA_MAX_RANK];
  if (!expect_name(P, name, "to declare")) return;
  if (!expect(P, ':', "after the name") || !parse_type(P, &dt, &rank, shape)) {
    poison(P, name);
    return;
  }
  nv_init init = {0};
  if (op == NV_OP_PARAM || op == NV_OP_CONSTANT) {
    if (!expect(P, '=', "before the initializer") || !parse_init(P, &init)) {
      free(init.path);
      poison(P, name);
      return;
    }
    if (!fe_dtype_is_float(dt)) {
      nv_error(P->d, loc, "%s '%s': must be f32 or f64, got %s", op == NV_OP_PARAM ? "param" : "const", name,
               fe_dtype_name(dt));
      P->failed = true;
      free(init.path);
      poison(P, name);
      return;
    }
  }
  nv_node *n = fe_graph_leaf(P->g, P->d, op, name, dt, rank, shape, loc);
  if (!n) {
    free(init.path);
    P->failed = true;
    poison(P, name);
    return;
  }
  n->role = role;
  n->init = init;
  define(P, name, n, loc);
}

static void parse_stmt(parser *P) {
  if (is_name(P, "input")) {
    parse_decl(P, NV_OP_INPUT, NOVA_ROLE_INPUT);
    return;
  }
  if (is_name(P, "label")) {
    parse_decl(P, NV_OP_INPUT, NOVA_ROLE_LABEL);
    return;
  }
  if (is_name(P, "const")) {
    parse_decl(P, NV_OP_CONSTANT, NOVA_ROLE_INPUT);
    return;
  }
  if (is_name(P, "param")) {
    parse_decl(P, NV_OP_PARAM, NOVA_ROLE_PARAM);
    return;
  }
  if (is_name(P, "precision")) { /* precision bf16: the default of novac --precision */
    next(P);
    nv_loc loc = P->t.loc;
    char v[256];
    if (!expect_name(P, v, "after 'precision' (fp32, bf16, fp16 or tf32)")) return;
    if (strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16") && strcmp(v, "tf32")) {
      nv_error(P->d, loc, "unknown precision '%s'; expected fp32, bf16, fp16 or tf32", v);
      P->failed = true;
      return;
    }
    if (P->g->precision[0]) {
      nv_error(P->d, loc, "'precision' is given twice");
      P->failed = true;
      return;
    }
    memcpy(P->g->precision, v, strlen(v) + 1); /* one of the four names above */
    return;
  }
  if (is_name(P, "seed")) {
    next(P);
    int64_t v;
    if (parse_int_value(P, "seed", &v)) P->g->seed = (uint64_t)v;
    return;
  }
  bool out = is_name(P, "output");
  if (out) next(P);
  char name[256];
  nv_loc loc = P->t.loc;
  if (!expect_name(P, name, out ? "after 'output'" : "at the start of a statement")) return;
  nv_node *n = NULL;
  if (is_punct(P, '=')) {
    next(P);
    ev v = parse_expr(P);
    if (P->failed) {
      poison(P, name);
      return;
    }
    if (v.is_lit) {
      nv_error(P->d, v.loc, "'%s' is a plain number; a value must be a tensor expression", name);
      P->failed = true;
      return;
    }
    n = v.node;
    if (!define(P, name, n, loc)) return;
  } else if (out) {
    sym *s = find_sym(P, name);
    n = s ? s->node : NULL;
    if (!n) {
      if (s) { /* its definition failed, already reported */
        P->failed = true;
        return;
      }
      nv_error(P->d, loc, "output '%s' is not defined", name);
      P->failed = true;
      return;
    }
  } else {
    if (P->t.kind != T_BAD)
      nv_error(P->d, P->t.loc, "expected '=' after '%s', found '%s'", name, tok_desc(&P->t));
    P->failed = true;
    return;
  }
  if (out && fe_graph_add_output(P->g, P->d, name, n, loc)) P->failed = true;
}

nv_graph *fe_parse_text(nv_diag *d, const char *file, const char *text, size_t len,
                        const char *basedir, fe_dim_binding *dims, int ndims) {
  parser P = {0};
  P.d = d;
  P.g = fe_graph_create();
  P.file = file;
  P.src = P.p = text;
  P.end = text + len;
  P.basedir = basedir ? basedir : "";
  P.line = P.col = 1;
  P.dims = dims;
  P.ndims = ndims;
  if (!P.g) return NULL;
  next(&P);
  while (P.t.kind != T_EOF && nv_diag_count(d) < NV_MAX_ERRORS) {
    if (P.t.kind == T_NL) {
      next(&P);
      continue;
    }
    P.failed = false;
    P.nest = 0;
    parse_stmt(&P);
    if (!P.failed && P.t.kind != T_NL && P.t.kind != T_EOF) {
      nv_error(d, P.t.loc, "expected end of line, found '%s'", tok_desc(&P.t));
      P.failed = true;
    }
    if (P.failed) { /* resynchronise at the next line */
      P.depth = 0;
      while (P.t.kind != T_NL && P.t.kind != T_EOF) next(&P);
    }
  }
  if (nv_diag_count(d) == 0 && P.g->noutputs == 0)
    nv_error(d, (nv_loc){file, 0, 0}, "no output declared; add a line 'output NAME'");
  for (int i = 0; i < P.nsym; i++) free(P.syms[i].name);
  free(P.syms);
  free(P.symtab);
  if (nv_diag_count(d)) {
    fe_graph_destroy(P.g);
    return NULL;
  }
  return P.g;
}
