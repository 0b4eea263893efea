/* NumPy .npy files of float32 for the command line: a strict reader and a
 * writer that never leaves a half-written file under the final name. */
#ifndef CLATTN_NPY_H
#define CLATTN_NPY_H

#include <stddef.h>

enum { NPY_MAX_DIMS = 8 };

typedef struct npy_array {
    int ndim;
    size_t shape[NPY_MAX_DIMS];
    size_t count; /* elements */
    float *data;  /* malloc'd; free with npy_free() */
} npy_array;

/* Reads a little-endian float32 ('<f4'), C-order array. On failure returns
 * -1 with a one-line reason in err, and out holds nothing to free. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* Parses a whole .npy image already in memory; the data is copied. */
int npy_parse(const unsigned char *bytes, size_t size, npy_array *out, char *err, size_t errlen);

void npy_free(npy_array *a);

/* Writes the array to a new temporary file beside path and puts its name
 * in tmp (at least strlen(path) + 16 bytes). Publish it with
 * npy_commit(tmp, path) or remove it with npy_discard(tmp). */
int npy_write_temp(const char *path, const size_t *shape, int ndim, const float *data,
                   char *tmp, size_t tmplen, char *err, size_t errlen);
int npy_commit(const char *tmp, const char *path, char *err, size_t errlen);
void npy_discard(const char *tmp);

#endif /* CLATTN_NPY_H */
