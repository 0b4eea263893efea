/* A variant's tuning search, which `clattn tune` (src/cli/tune.c) runs:
 * the kernel shapes it tries and the variables it sets them through. Each
 * variant that can be tuned defines one in its file of
 * src/opencl/variants/; the tuner knows no variant by name. */
#ifndef CLATTN_OPENCL_SEARCH_H
#define CLATTN_OPENCL_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

/* A candidate shape as its variable takes it, e.g. "32,32,4,64,4". */
enum { CLATTN_SEARCH_TEXT = 32 };

/* The ops a search tunes, indexing variable[] and entry[]. */
enum { SEARCH_BOTH, SEARCH_FORWARD, SEARCH_BACKWARD };

/* Receives each candidate a stage makes; returns 0 once it takes no more. */
typedef int (*clattn_search_add)(void *sink, const char *text);

typedef struct clattn_ocl_search {
    /* The shape's fields, for messages: "WARPS,WSPLIT,TILE,PLANES". */
    const char *form;
    /* The variable a candidate is set through, and the tuning file's entry
     * name for the winner, for both ops, the forward alone and the backward
     * alone. */
    const char *variable[3];
    const char *entry[3];
    /* Every variable of this variant's that shapes its kernels, NULL
     * ended: the tuner clears them so that the table's shape is the one to
     * beat. */
    const char *const *clears;
    /* A shape given on the command line, as the variable takes it, into
     * out (CLATTN_SEARCH_TEXT bytes); 0 where it is not one of this
     * variant's. */
    int (*candidate)(const char *text, char *out);
    /* Stage 1 (best NULL): how the work is split, at a middling tile;
     * stage 2: the tile and the rest around stage 1's winner `best`. Gives
     * each shape whose work-group fits max_wg to add. micro_to: the largest
     * head_dim whose shapes may be micro-tiles (where the variant has
     * them). */
    void (*generate)(int stage, const char *best, uint32_t head_dim, uint32_t micro_to,
                     clattn_dtype dtype, size_t max_wg, clattn_search_add add, void *sink);
} clattn_ocl_search;

/* The search of the variant named `name`, or NULL where it has none. */
const clattn_ocl_search *clattn_ocl_search_of(const char *name);
/* The names of the variants that have one, into names: "mma or tiled". */
void clattn_ocl_searchable(char *names, size_t size);
/* Each variant's variables of clears, in turn, for i = 0, 1, ...; NULL
 * past the last. */
const char *clattn_ocl_search_variable(size_t i);

/* The default's choice (choice.c), as `clattn tune --variant auto` keeps
 * it: the size class of a problem, "short" or "long", as its auto entry
 * names it; and whether an auto entry may name the variant `name` (one
 * built per head_dim). */
const char *clattn_ocl_size_class_name(const clattn_shape *s);
int clattn_ocl_choosable(const char *name);

#endif
