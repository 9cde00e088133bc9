/* novarun_ckpt.c: --save and --load, checkpoints of a training step.
 *
 * A checkpoint is a safetensors file (novarun_st.c) holding every param,
 * opt_state and buffer tensor of the step under its name in the step, with
 * __metadata__ {"format": "novac", "graph_hash": the step's graph hash,
 * "step": the number of steps done, in decimal}.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "novarun.h"
#include "rt_dtype.h"

#define NR_TYPE_LEN 320

static int nr_is_state(nova_role r) { return r == NOVA_ROLE_PARAM || r == NOVA_ROLE_OPT_STATE || r == NOVA_ROLE_BUFFER; }

static const char *nr_graph_hash(nr_step *s) { return s->api.graph_hash ? s->api.graph_hash(s->step) : ""; }

/* Every tensor of S into a new array (caller frees); NULL after a diagnostic. */
static nova_tensor_info *nr_step_tensors(nr_step *s, int *n) {
  *n = s->api.num_tensors(s->step);
  nova_tensor_info *v = calloc((size_t)(*n > 0 ? *n : 1), sizeof *v);
  if (!v) {
    nr_error("out of memory");
    return NULL;
  }
  for (int i = 0; i < *n; i++)
    if (nr_tensor(s, i, &v[i])) {
      free(v);
      return NULL;
    }
  return v;
}

int nr_checkpoint_save(nr_step *s, const char *path, long long step) {
  int n, k = 0, rc;
  nova_tensor_info *v = nr_step_tensors(s, &n);
  if (!v) return 1;
  nr_st_out *out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
  if (!out) {
    free(v);
    return nr_error("out of memory");
  }
  for (int i = 0; i < n; i++) {
    if (!nr_is_state(v[i].role)) continue;
    const void *data;
    nova_tensor_info got;
    if (s->api.get(s->step, v[i].name, &data, &got) != NOVA_OK) {
      free(out);
      free(v);
      return nr_error("%s: %s", s->path, s->api.error(s->step));
    }
    out[k++] = (nr_st_out){v[i].name, v[i].dtype, v[i].rank, v[i].shape, v[i].nbytes, data};
  }
  char steps[32];
  snprintf(steps, sizeof steps, "%lld", step);
  const char *keys[] = {"format", "graph_hash", "step"};
  const char *values[] = {"novac", nr_graph_hash(s), steps};
  rc = nr_st_write(path, k, out, 3, keys, values);
  free(out);
  free(v);
  return rc;
}

/* __metadata__ "step" of F into *STEP (0 if absent). */
static int nr_checkpoint_step(const nr_st_file *f, long long *step) {
  const char *text = nr_st_metadata(f, "step");
  *step = 0;
  if (!text) return 0;
  size_t len = strlen(text);
  if (len == 0 || len > 18 || strspn(text, "0123456789") != len)
    return nr_error("%s: __metadata__ \"step\" is \"%s\", not a number of steps", f->path, text);
  *step = strtoll(text, NULL, 10);
  return 0;
}

/* The step's tensor named NAME in V[N], or NULL. */
static const nova_tensor_info *nr_lookup(const nova_tensor_info *v, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(v[i].name, name)) return &v[i];
  return NULL;
}

static int nr_same_type(const nr_st_tensor *t, const nova_tensor_info *info) {
  if (t->dtype != info->dtype || t->rank != info->rank) return 0;
  for (int d = 0; d < t->rank; d++)
    if (t->shape[d] != info->shape[d]) return 0;
  return 1;
}

/* Every tensor of F is a param or opt_state of the step (V[N]) of the same
 * dtype and shape, and every param and opt_state is in F.  NOTE says when
 * F was written for another graph. */
static int nr_checkpoint_match(const nr_st_file *f, const nova_tensor_info *v, int n, const char *note) {
  char have[NR_TYPE_LEN], want[NR_TYPE_LEN];
  for (int i = 0; i < f->ntensors; i++) {
    const nr_st_tensor *t = &f->tensors[i];
    const nova_tensor_info *info = nr_lookup(v, n, t->name);
    if (!info) return nr_error("%s: tensor '%s' is not a tensor of the step%s", f->path, t->name, note);
    if (!nr_is_state(info->role))
      return nr_error("%s: tensor '%s' is the step's %s, not a param or opt_state%s", f->path, t->name,
                      rt_role_name(info->role), note);
    if (!nr_same_type(t, info))
      return nr_error("%s: tensor '%s': the checkpoint holds %s, the step's %s is %s%s", f->path, t->name,
                      nr_type_str(have, sizeof have, t->dtype, t->rank, t->shape), rt_role_name(info->role),
                      nr_type_str(want, sizeof want, info->dtype, info->rank, info->shape), note);
  }
  for (int i = 0; i < n; i++)
    if (nr_is_state(v[i].role) && !nr_st_find(f, v[i].name))
      return nr_error("%s: the checkpoint lacks %s '%s' (%s) of the step%s", f->path, rt_role_name(v[i].role),
                      v[i].name, nr_type_str(want, sizeof want, v[i].dtype, v[i].rank, v[i].shape), note);
  return 0;
}

/* Reads F's data section and binds every tensor of F to S; F matched. */
static int nr_checkpoint_bind(nr_step *s, const nr_st_file *f) {
  unsigned char *data = malloc(f->data_size ? (size_t)f->data_size : 1);
  if (!data) return nr_error("%s: out of memory for %llu bytes", f->path, (unsigned long long)f->data_size);
  int rc = nr_st_read(f, 0, data, (size_t)f->data_size);
  /* every check passed and every byte is in memory: only now is S changed */
  for (int i = 0; !rc && i < f->ntensors; i++) {
    const nr_st_tensor *t = &f->tensors[i];
    if (s->api.bind(s->step, t->name, t->dtype, t->rank, t->shape, data + t->begin) != NOVA_OK)
      rc = nr_error("%s: cannot restore '%s': %s", f->path, t->name, s->api.error(s->step));
  }
  free(data);
  return rc;
}

int nr_checkpoint_load(nr_step *s, const char *path, long long *step) {
  nr_st_file f;
  char note[256] = "";
  int n;
  if (nr_st_open(path, &f)) return 1;
  nova_tensor_info *v = nr_step_tensors(s, &n);
  if (!v) {
    nr_st_close(&f);
    return 1;
  }
  const char *mine = nr_graph_hash(s), *theirs = nr_st_metadata(&f, "graph_hash");
  int other_graph = theirs && mine[0] && strcmp(theirs, mine) != 0;
  if (other_graph)
    snprintf(note, sizeof note, " (the checkpoint was written for graph %.32s, this step is graph %.32s)", theirs,
             mine);
  int rc = nr_checkpoint_step(&f, step);
  if (!rc) rc = nr_checkpoint_match(&f, v, n, note);
  if (!rc) rc = nr_checkpoint_bind(s, &f);
  if (!rc && other_graph)
    nr_warning("%s was written for graph %s, this step is graph %s; its tensors match by name, dtype and shape, "
               "so it was loaded",
               path, theirs, mine);
  else if (!rc && !theirs)
    nr_warning("%s records no graph_hash; its tensors match the step by name, dtype and shape, so it was loaded",
               path);
  free(v);
  nr_st_close(&f);
  return rc;
}
