/* NumPy .npy files for the command line: float32 ('<f4'), 16-bit arrays
 * ('<f2' float16, '<u2' or '<i2' holding bfloat16 bit patterns), int32
 * ('<i4', packed sequences' prefix sums) and bool ('|b1', a mask); a
 * strict reader and a writer that never leaves a half-written file under
 * the final name. */
#ifndef CLATTN_NPY_H
#define CLATTN_NPY_H

#include <stddef.h>
#include <stdint.h>

enum { NPY_MAX_DIMS = 8 };

typedef struct npy_array {
    int ndim;
    size_t shape[NPY_MAX_DIMS];
    size_t count;  /* elements */
    char descr[4]; /* "<f4", "<f2", "<u2", "<i2", "<i4" or "|b1" */
    float *data;   /* '<f4' elements, else NULL; malloc'd, free with npy_free() */
    uint16_t *bits; /* 2-byte elements, else NULL; malloc'd likewise */
    int32_t *ints;  /* '<i4' elements, else NULL; malloc'd likewise */
    uint8_t *bools; /* '|b1' elements (0 or 1), else NULL; malloc'd likewise */
} npy_array;

/* Reads a little-endian, C-order array of one of the descrs above. On
 * failure returns -1 with a one-line reason in err, and out holds nothing
 * to free. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* Parses a whole .npy image already in memory; the data is copied. */
int npy_parse(const unsigned char *bytes, size_t size, npy_array *out, char *err, size_t errlen);

void npy_free(npy_array *a);

/* Writes the array (descr "<f4" and floats, or a 2-byte descr and uint16_t
 * elements) to a new temporary file beside path and puts its name in tmp
 * (at least strlen(path) + 16 bytes). Publish it with npy_commit(tmp,
 * path) or remove it with npy_discard(tmp). */
int npy_write_temp(const char *path, const size_t *shape, int ndim, const char *descr,
                   const void *data, char *tmp, size_t tmplen, char *err, size_t errlen);
int npy_commit(const char *tmp, const char *path, char *err, size_t errlen);
void npy_discard(const char *tmp);

#endif /* CLATTN_NPY_H */
