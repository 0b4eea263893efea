/* The helpers the command line's commands share (common.c). */
#ifndef CLATTN_CLI_COMMON_H
#define CLATTN_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "clattn.h"

enum { EXIT_DEVICE = 1, EXIT_INPUT = 2 };

/* One command-line option: a flag, a path, a count, a positive number, a
 * number from 0 to under 1, or a 64-bit whole number. */
typedef enum opt_kind { OPT_FLAG, OPT_STRING, OPT_UINT, OPT_POSITIVE, OPT_FRACTION, OPT_U64 } opt_kind;

typedef struct opt {
    const char *name;
    opt_kind kind;
    void *value; /* int*, const char**, uint32_t*, float* (POSITIVE, FRACTION), uint64_t* */
    int required;
    int seen;
} opt;

/* Parses argv against opts; prints one line and returns 0 on bad input. */
int parse_opts(const char *cmd, int argc, char **argv, opt *opts, size_t n);
int wants_help(int argc, char **argv);
double now(void);
/* Creates a context; returns 0, or the exit status of the failure after
 * printing it. */
int open_context(const char *cmd, const char *device, const char *variant, clattn_context **ctx);
float next_uniform(uint64_t *state);
void fill_uniform(float *a, size_t n, float gain, uint64_t *state);
float *alloc_floats(size_t n);
/* Reports a failed op; returns the exit status: a device failure, or input
 * the device cannot take. */
int op_failed(const char *cmd, clattn_status st);
/* --dtype's value, f32, f16 or bf16, into *dtype; prints one line and
 * returns 0 for anything else. */
int parse_dtype(const char *cmd, const char *name, clattn_dtype *dtype);
/* The dtype of an array's descr: '<f2' float16, '<u2' and '<i2' bfloat16's
 * bits, anything else float32. */
clattn_dtype descr_dtype(const char *descr);

/* The score modifiers' options, shared by the file commands and bench:
 * --softcap C, --alibi SLOPES.npy, --dropout P --seed S [--dropout-offset N],
 * --sinks SINKS.npy, --bias B.npy (float32, float16, bfloat16 bits or bool,
 * [B or 1][H or 1][Sq][Sk]),
 * and the caller's functions: --score-fn FILE.cl, --mask-fn FILE.cl,
 * --score-params P.npy. mod_free() releases what mod_apply and mod_native
 * made. */
typedef struct mod_opts {
    float softcap, dropout;
    const char *alibi, *sinks_file, *bias_file;
    uint64_t seed, offset;
    const char *score_file, *mask_file, *params_file;
    float *slopes; /* read from alibi by mod_apply */
    float *sinks;  /* read from sinks_file by mod_apply */
    void *bias;    /* read from bias_file by mod_apply, where it is float32 or float16 */
    uint8_t *bool_mask; /* where it is bool */
    size_t bias_shape[4];
    char *score_src, *mask_src; /* the functions' files, read by mod_apply */
    float *params;
    uint32_t nparams;
    void *lib; /* the functions compiled for native (functions.c) */
} mod_opts;
enum { MOD_OPTS = 10 };
/* Appends the MOD_OPTS options that fill m to opts[*n ...]. */
void mod_opts_add(opt *opts, size_t *n, mod_opts *m);
/* Sets the shape's modifiers from m (its num_heads known): reads the slopes
 * and sinks (float32, num_heads entries each) and the bias, checks
 * --dropout has --seed.
 * Prints one line and returns 0 on bad input. */
int mod_apply(const char *cmd, const opt *opts, size_t n, mod_opts *m, clattn_shape *s);
/* functions.c: reads the function files and the parameters of m into s;
 * prints one line and returns 0 on bad input. */
int mod_read_functions(const char *cmd, mod_opts *m, clattn_shape *s);
/* Where `native` (a native context will run s), compiles m's function
 * files as C99 with the system's C compiler and sets s's C forms from
 * them; prints what failed and returns 0 where that fails, else 1. */
int mod_native(const char *cmd, int native, mod_opts *m, clattn_shape *s);
void mod_free(mod_opts *m);
/* --window-left L, FlashAttention's left side, into *window (L + 1) where
 * it was given; prints one line and returns 0 where --window was given
 * too, or L is 2^32 - 1. */
int window_left_apply(const char *cmd, const opt *opts, size_t n, uint32_t left,
                      uint32_t *window);

/* The usage lines of those options, each line after `indent`. */
#define MOD_USAGE_AT(indent)                                                                \
    indent "[--softcap C] [--alibi SLOPES.npy] [--sinks SINKS.npy] [--bias B.npy]\n" indent \
           "[--dropout P --seed S [--dropout-offset N]]\n" indent                          \
           "[--score-fn FILE.cl [--score-params P.npy]] [--mask-fn FILE.cl]\n"

#endif
