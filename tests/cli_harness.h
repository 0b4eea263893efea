/* The CLI tests' harness (cli_harness.c), shared by check_cli.c and
 * check_cli_failures.c. */
#ifndef CLATTN_TESTS_CLI_HARNESS_H
#define CLATTN_TESTS_CLI_HARNESS_H

#include <check.h>
#include <stddef.h>
#include <sys/resource.h>

#include "clattn.h"
#include "reference.h"

/* The test's folder, and the last run's stdout and stderr. */
extern char dir[256];
extern char out_text[65536], err_text[65536];

/* A fresh folder under /tmp for the test. */
void make_dir(void);
/* name inside the test's folder (16 results may be held at once). */
const char *path(const char *name);
/* A file's first size - 1 bytes, as a string. */
void slurp(const char *file, char *text, size_t size);

/* Runs clattn with the given arguments (NULL-terminated); returns the exit
 * status and keeps stdout and stderr in out_text and err_text. */
int run(const char *arg0, ...);
/* RLIMIT_FSIZE for the next run's child, in bytes (0: unchanged); the
 * name whose renames tests/failrename (CLATTN_FAILRENAME) fails in it; the
 * OpenCL call (NAME[:N]) that tests/faultcl (CLATTN_FAULTCL) fails in it. */
extern rlim_t run_file_limit;
extern const char *run_fail_rename;
extern const char *run_fault;

/* .npy files in the test's folder: float32 data, raw bytes, and a header
 * dict (padded as NumPy pads it) with n zero floats of data. */
void save(const char *name, const size_t *shape, int ndim, const float *data);
void save_bytes(const char *name, const void *bytes, size_t n);
void save_header(const char *name, const char *dict, size_t n);
int exists(const char *name);
/* Only the files a test wrote itself: no temporaries, no outputs. */
int count_entries(void);
/* Removes the test's folder and everything in it. */
void cleanup(void);
/* Whether two files hold the same bytes. */
int same_bytes(const char *a, const char *b);
/* A file's bytes into buf (at most size), their count in *n. */
void read_all(const char *file, char *buf, size_t size, size_t *n);
/* The lines of a text. */
int lines(const char *text);
/* Writes q.npy, k.npy, v.npy, o.npy, do.npy and lse.npy for the shape
 * (batched: 4-D). */
void write_problem(problem *p, const clattn_shape *s, int batched);
/* The tests' usual shape. */
clattn_shape cli_shape(void);
/* Reads an output, checks its shape and compares it with ref. */
void expect_file(const char *name, int ndim, const size_t *shape, const double *ref,
                 const double *mag, size_t n);
void check_output(const problem *p, const char *name, int ndim, const size_t *shape);

/* check_cli_failures.c: its tests, added to tc. */
void add_cli_failure_tests(TCase *tc);
/* check_cli_mods.c: the modifiers', functions' and bias's tests. */
void add_cli_modifier_tests(TCase *tc);

#endif
