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
    int size;    /* CHOICE_SHORT, CHOICE_LONG, CHOICE_ANY or CHOICE_FEW (few_blocks) */
    int dropout; /* 0, 1 or CHOICE_ANY */
    const char *variant;
    const char *reason;
} choice_row;

/* Measured on an H100 (compute capability 9.0, as the H200) with
 * `tools/device_run.sh choose`: results/h100-choice.jsonl (without dropout)
 * and results/h100-choice-dropout.log (p = 0.1), GFLOP/s of mma / tiled.
 * 16-bit runs mma everywhere (6-17x tiled's); float32 is mixed. */
static const choice_row table[] = {
    {9, 0, CHOICE_BACKWARD, 64, CHOICE_FEW, CHOICE_ANY, "mma",
     "f32 d64 backward with few blocks of keys: mma's key side in 16 parts 8.8 TFLOP/s against "
     "tiled's 2.1 at S 1024, 8 on 2 heads (results/parts-h100.log)"},
    {9, 0, CHOICE_BACKWARD, 64, CHOICE_SHORT, 0, "tiled",
     "f32 d64 short backward without dropout: tiled 17.6 / 16.9 TFLOP/s against mma's 15.8 / "
     "15.2 on ViT (results/order-h100.log); past S 1024 mma's order by heads under a causal "
     "mask wins: 24.4 / 26.1 / 27.0 against 23.8 / 25.5 / 26.1 at S 4096, S 4096 GQA and S "
     "16384 (with dropout mma's shared draws win too: 26.2 against 19.4)"},
    {9, 0, CHOICE_ANY, 64, CHOICE_ANY, CHOICE_ANY, "mma",
     "f32 d64: mma's forward 28.7 / 29.8 / 30.5 TFLOP/s at S 4096 (a block's heads side by "
     "side under a causal mask), S 4096 GQA and S 16384 (results/order-h100.log) against "
     "tiled's 22.7 / 26.5 / 26.6 (h100-choice.jsonl), 18.2 against 15.1 on ViT, 7.8 against "
     "5.4 at S 1024; the backward past S 1024 as above"},
    {9, 0, CHOICE_ANY, 128, CHOICE_LONG, CHOICE_ANY, "tiled",
     "f32 d80-d128 past S 1024: tiled 16.6-26.4 against mma's 14.2-23.2 at d96, d112 and "
     "every d128 shape, forward and backward, with dropout too (22.2-23.2 against 17.3-20.9); "
     "the one exception measured, d80 GQA, ran mma at 18.3 against 14.8"},
    {9, 0, CHOICE_FORWARD, 256, CHOICE_ANY, CHOICE_ANY, "tiled",
     "f32 d256 forward: tiled 16.9 against 14.5 (15.8 against 12.4 with dropout); mma keeps "
     "the backward, 11.4 against 9.9"},
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

const char *clattn_ocl_size_class_name(const clattn_shape *s)
{
    return size_names[clattn_ocl_size_class(s)];
}

int clattn_ocl_choosable(const char *name)
{
    const clattn_ocl_variant *v = clattn_ocl_find_variant(name);
    return v && v->per_head_dim;
}

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
    c->variant = clattn_ocl_choosable(variant) ? clattn_ocl_find_variant(variant) : NULL;
    return c->op >= 0 && c->size >= 0 && c->variant;
}

void clattn_ocl_format_choice(const choice_entry *c, char *buf, size_t size)
{
    snprintf(buf, size, "auto %s head_dim %u: %s,%s=%s", clattn_ocl_dtype_name(c->dtype),
             (unsigned)c->head_dim, op_names[c->op], size_names[c->size], c->variant->name);
}

/* CHOICE_FEW: whether s's key side has fewer blocks of 64 keys of a KV
 * head than the device has compute units (mma splits its key side into
 * parts there: variants/mma.c's key_parts). */
static int few_blocks(const struct clattn_cl_state *cl, const clattn_shape *s)
{
    const size_t blocks = ((size_t)s->kv_seq + 63u) / 64u * s->num_kv_heads * s->batch;
    return blocks < cl->limits.compute_units;
}

/* Whether the context's device runs v (its own variant it does: no query). */
static int runs(const struct clattn_cl_state *cl, const clattn_ocl_variant *v)
{
    return v && (v == cl->variant || !v->runs_on || v->runs_on(cl->device));
}

/* The variant the table or the tuning file picks for op and s. */
static const clattn_ocl_variant *chosen(const struct clattn_cl_state *cl, clattn_op op,
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
            (r->size == CHOICE_ANY || r->size == size ||
             (r->size == CHOICE_FEW && size == CHOICE_SHORT && few_blocks(cl, s))) &&
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

const clattn_ocl_variant *clattn_ocl_variant_for(const struct clattn_cl_state *cl, clattn_op op,
                                                 const clattn_shape *s, const char **reason)
{
    const clattn_ocl_variant *v = chosen(cl, op, s, reason);
    const clattn_ocl_variant *run = v ? v : clattn_ocl_generic_variant();
    if (!(clattn_op_modifiers(s, op) & CLATTN_MOD_USER) || run->programmable)
        return v;
    const clattn_ocl_variant *tiled = clattn_ocl_find_variant("tiled");
    *reason = "the caller's functions run on tiled";
    return runs(cl, tiled) ? tiled : NULL;
}
