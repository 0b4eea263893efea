/* The default's choice of variant per call (docs/tuning.md, "The
 * default's choice"): a context made without a variant runs each call on
 * the variant that the tuning file's `auto` entries, else the table below,
 * name for its device, dtype, op, head_dim and size class, and on its own
 * (the device's first variant) where neither names one. */
#include <stdio.h>
#include <string.h>

#include "variant.h"

/* One choice, measured with `clattn tune --variant auto` and kept with its
 * reason: a device class (NVIDIA's compute capability major), float32 or
 * 16-bit, an op (CHOICE_ANY: both), head_dims up to head_dim_to (a class:
 * 64, 128, 256), a size class (CHOICE_ANY: both), and calls with dropout
 * or without (CHOICE_ANY: both; the variants draw its mask at different
 * costs). The first row that holds wins. */
typedef struct choice_row {
    int nv_major;
    int sixteen; /* 0: float32; 1: fp16 and bf16 */
    int op;      /* CHOICE_FORWARD, CHOICE_BACKWARD (grad-V too) or CHOICE_ANY */
    uint32_t head_dim_to;
    int size;    /* CHOICE_SHORT, CHOICE_LONG or CHOICE_ANY */
    int dropout; /* 0, 1 or CHOICE_ANY */
    const char *variant;
    const char *reason;
} choice_row;

static const choice_row table[] = {
    {9, 0, CHOICE_ANY, 256, CHOICE_ANY, 0, "tiled",
     "H200: tiled's float32 beats mma's 3xtf32 at every bench shape, forward and backward "
     "(results/h200-choice.json)"},
};

int clattn_ocl_size_class(const clattn_shape *s)
{
    const uint32_t longest = s->q_seq > s->kv_seq ? s->q_seq : s->kv_seq;
    return longest <= CHOICE_SHORT_TO ? CHOICE_SHORT : CHOICE_LONG;
}

int clattn_ocl_choice_op(clattn_op op)
{
    return op == CLATTN_OP_FORWARD ? CHOICE_FORWARD : CHOICE_BACKWARD;
}

static const char *const op_names[2] = {"forward", "backward"};
static const char *const size_names[2] = {"short", "long"};

int clattn_ocl_parse_choice(const char *shape, choice_entry *c)
{
    char op[16], size[16], variant[32], end;
    if (sscanf(shape, "%15[a-z],%15[a-z]=%31[a-z0-9_]%c", op, size, variant, &end) != 3)
        return 0;
    c->op = c->size = -1;
    for (int i = 0; i < 2; ++i) {
        if (!strcmp(op, op_names[i]))
            c->op = i;
        if (!strcmp(size, size_names[i]))
            c->size = i;
    }
    c->variant = clattn_ocl_find_variant(variant);
    return c->op >= 0 && c->size >= 0 && c->variant && c->variant->per_head_dim;
}

void clattn_ocl_format_choice(const choice_entry *c, char *buf, size_t size)
{
    snprintf(buf, size, "auto %s head_dim %u: %s,%s=%s", clattn_ocl_dtype_name(c->dtype),
             (unsigned)c->head_dim, op_names[c->op], size_names[c->size], c->variant->name);
}

/* Whether the context's device runs v. */
static int runs(const struct clattn_cl_state *cl, const clattn_ocl_variant *v)
{
    return v && (!v->runs_on || v->runs_on(cl->device));
}

const clattn_ocl_variant *clattn_ocl_variant_for(const struct clattn_cl_state *cl, clattn_op op,
                                                 const clattn_shape *s, const char **reason)
{
    *reason = NULL;
    if (!cl->choose)
        return cl->variant;
    const int o = clattn_ocl_choice_op(op), size = clattn_ocl_size_class(s);
    for (size_t i = 0; i < cl->choices.count; ++i) {
        const choice_entry *c = &cl->choices.entries[i];
        if (c->dtype == s->dtype && c->head_dim == s->head_dim && c->op == o && c->size == size &&
            runs(cl, c->variant)) {
            *reason = "the tuning file's auto entry";
            return c->variant;
        }
    }
    const int sixteen = s->dtype != CLATTN_DTYPE_F32, dropout = s->dropout_p > 0.0f;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; ++i) {
        const choice_row *r = &table[i];
        if (r->nv_major == cl->mma.nv_major && r->sixteen == sixteen &&
            (r->op == CHOICE_ANY || r->op == o) && s->head_dim <= r->head_dim_to &&
            (r->size == CHOICE_ANY || r->size == size) &&
            (r->dropout == CHOICE_ANY || r->dropout == dropout)) {
            const clattn_ocl_variant *v = clattn_ocl_find_variant(r->variant);
            if (runs(cl, v)) {
                *reason = r->reason;
                return v;
            }
        }
    }
    return cl->variant;
}
