/* .npy reading and writing (format versions 1.0, 2.0 and 3.0). */
#define _POSIX_C_SOURCE 200809L
#include "npy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

void npy_free(npy_array *a)
{
    if (!a)
        return;
    free(a->data);
    free(a->bits);
    free(a->ints);
    free(a->bools);
    a->bools = NULL;
    a->data = NULL;
    a->bits = NULL;
    a->ints = NULL;
}

/* The header dict, parsed as the Python literal it is: { 'key': value, ... }
 * with string keys (either quote), each value a string, True or False, a
 * tuple, or a list (a structured dtype's), and a last comma allowed. Each
 * key's value is its text, as written; a later duplicate wins, as in
 * Python. 0, or -1 with err set. */
typedef struct npy_dict {
    const char *descr, *order, *shape;
} npy_dict;

static const char *skip_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        ++p;
    return p;
}

/* The end of the value at p (one past it), or NULL. */
static const char *value_end(const char *p)
{
    if (*p == '\'' || *p == '"') {
        const char *q = strchr(p + 1, *p);
        return q ? q + 1 : NULL;
    }
    if (!strncmp(p, "True", 4))
        return p + 4;
    if (!strncmp(p, "False", 5))
        return p + 5;
    if (*p == '(' || *p == '[') { /* to the matching bracket, strings skipped */
        int depth = 0;
        for (const char *q = p; *q; ++q) {
            if (*q == '\'' || *q == '"') {
                q = strchr(q + 1, *q);
                if (!q)
                    return NULL;
            } else if (*q == '(' || *q == '[') {
                ++depth;
            } else if ((*q == ')' || *q == ']') && --depth == 0) {
                return q + 1;
            }
        }
    }
    return NULL;
}

static int parse_dict(const char *h, npy_dict *d, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    const char *p = skip_space(h);
    if (*p++ != '{')
        return fail(err, errlen, "malformed .npy header (not a dict): %.80s", h);
    for (;;) {
        p = skip_space(p);
        if (*p == '}')
            break;
        if (*p != '\'' && *p != '"')
            return fail(err, errlen, "malformed .npy header (a key is not a string): %.80s", h);
        const char *key = p + 1, *key_end = strchr(key, *p);
        if (!key_end)
            return fail(err, errlen, "malformed .npy header (an unclosed string): %.80s", h);
        const size_t klen = (size_t)(key_end - key);
        p = skip_space(key_end + 1);
        if (*p++ != ':')
            return fail(err, errlen, "malformed .npy header (no ':' after a key): %.80s", h);
        p = skip_space(p);
        const char **slot = klen == 5 && !strncmp(key, "descr", 5)           ? &d->descr
                            : klen == 13 && !strncmp(key, "fortran_order", 13) ? &d->order
                            : klen == 5 && !strncmp(key, "shape", 5)          ? &d->shape
                                                                              : NULL;
        if (!slot)
            return fail(err, errlen, ".npy header has a key other than descr, fortran_order "
                                     "and shape: %.*s", (int)(klen > 40 ? 40 : klen), key);
        const char *end = value_end(p);
        if (!end)
            return fail(err, errlen, "malformed .npy header (a value it cannot read): %.80s",
                        h);
        *slot = p;
        p = skip_space(end);
        if (*p == ',')
            ++p;
        else if (*p != '}')
            return fail(err, errlen, "malformed .npy header (no ',' between items): %.80s", h);
    }
    if (*skip_space(p + 1) != '\0')
        return fail(err, errlen, "malformed .npy header (text after the dict): %.80s", h);
    if (!d->descr || !d->order || !d->shape)
        return fail(err, errlen, ".npy header lacks %s", !d->descr ? "descr"
                                                           : !d->order ? "fortran_order"
                                                                       : "shape");
    return 0;
}

static int parse_shape(const char *v, npy_array *out, char *err, size_t errlen)
{
    if (*v != '(')
        return fail(err, errlen, "shape is not a tuple");
    ++v;
    out->ndim = 0;
    for (;;) {
        while (*v == ' ')
            ++v;
        if (*v == ')')
            break;
        if (*v < '0' || *v > '9')
            return fail(err, errlen, "shape holds something other than sizes");
        size_t n = 0;
        while (*v >= '0' && *v <= '9') {
            if (n > (SIZE_MAX - 9) / 10)
                return fail(err, errlen, "a size in the shape is too large");
            n = n * 10 + (size_t)(*v++ - '0');
        }
        if (out->ndim == NPY_MAX_DIMS)
            return fail(err, errlen, "more than %d dimensions", NPY_MAX_DIMS);
        out->shape[out->ndim++] = n;
        while (*v == ' ')
            ++v;
        if (*v == ',')
            ++v;
        else if (*v != ')')
            return fail(err, errlen, "malformed shape tuple");
    }
    return 0;
}

/* The preamble's format version, header length and where the header
 * starts, from the first `size` bytes (at least 10). */
static int parse_preamble(const unsigned char *b, size_t size, size_t *start, size_t *hlen,
                          char *err, size_t errlen)
{
    if (size < 10 || memcmp(b, "\x93NUMPY", 6) != 0)
        return fail(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
    const unsigned major = b[6];
    if (major == 1) {
        *hlen = (size_t)b[8] | (size_t)b[9] << 8;
        *start = 10;
    } else if (major == 2 || major == 3) {
        if (size < 12)
            return fail(err, errlen, "truncated .npy header");
        *hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        *start = 12;
    } else {
        return fail(err, errlen, "unsupported .npy format version %u", major);
    }
    return 0;
}

/* The value of a header key as it is written, up to the next key or the
 * dict's end, for messages. */
static int value_len(const char *v)
{
    const char *stop = NULL;
    if (*v == '\'') { /* a string: to its closing quote */
        stop = strchr(v + 1, '\'');
        stop = stop ? stop + 1 : NULL;
    } else if (*v == '[') { /* a structured dtype's list: to its bracket */
        stop = strstr(v, "], '");
        stop = stop ? stop + 1 : strrchr(v, ']') ? strrchr(v, ']') + 1 : NULL;
    }
    if (!stop)
        stop = strstr(v, ", '");
    const long n = stop ? stop - v : (long)strlen(v);
    return n > 60 ? 60 : (int)n;
}

/* The header (hlen bytes at h) into out's shape and descr, and the element
 * size and count. */
static int parse_header(const unsigned char *hb, size_t hlen, npy_array *out, size_t *elem,
                        char *err, size_t errlen)
{
    char *h = malloc(hlen + 1);
    if (!h)
        return fail(err, errlen, "out of memory");
    memcpy(h, hb, hlen);
    h[hlen] = '\0';
    if (strlen(h) != hlen) {
        free(h);
        return fail(err, errlen, "NUL byte in .npy header");
    }
    npy_dict d;
    int rc = parse_dict(h, &d, err, errlen);
    const char *descr = d.descr;
    static const char *const known[6] = {"<f4", "<f2", "<u2", "<i2", "<i4", "|b1"};
    int ok = 0;
    for (int i = 0; rc == 0 && i < 6; ++i)
        ok |= (descr[0] == '\'' || descr[0] == '"') && !strncmp(descr + 1, known[i], 3) &&
              descr[4] == descr[0];
    if (rc == 0 && !ok)
        /* The value alone, not what follows it in the header. */
        rc = fail(err, errlen,
                  "dtype is %.*s, want little-endian float32 ('<f4'), float16 ('<f2'), "
                  "bfloat16 bits ('<u2', '<i2'), int32 ('<i4') or bool ('|b1')",
                  value_len(descr), descr);
    else if (rc == 0 && strncmp(d.order, "False", 5) != 0)
        rc = fail(err, errlen, "array is in Fortran order, want C order");
    else if (rc == 0)
        rc = parse_shape(d.shape, out, err, errlen);
    if (rc == 0)
        memcpy(out->descr, descr + 1, 3);
    free(h);
    if (rc)
        return rc;
    *elem = out->descr[2] == '4' ? sizeof(float) : out->descr[2] == '1' ? 1u : sizeof(uint16_t);
    size_t count = 1;
    for (int i = 0; i < out->ndim; ++i) {
        if (out->shape[i] && count > SIZE_MAX / *elem / out->shape[i])
            return fail(err, errlen, "array too large");
        count *= out->shape[i];
    }
    out->count = count;
    return 0;
}

/* Hands out its element array: ints, float32 data or 16-bit bits, as its
 * descr says. */
static void attach(npy_array *out, void *data)
{
    if (!strcmp(out->descr, "<i4"))
        out->ints = data;
    else if (!strcmp(out->descr, "|b1"))
        out->bools = data;
    else if (!strcmp(out->descr, "<f4"))
        out->data = data;
    else
        out->bits = data;
}

/* The data (exactly count * elem bytes at d) into a new array of out. */
static int take_data(const unsigned char *d, npy_array *out, size_t elem, char *err,
                     size_t errlen)
{
    void *data = malloc(out->count ? out->count * elem : 1);
    if (!data)
        return fail(err, errlen, "out of memory for %zu elements", out->count);
    /* The hosts clattn runs on are little-endian, as these descrs are. */
    memcpy(data, d, out->count * elem);
    attach(out, data);
    return 0;
}

int npy_parse(const unsigned char *b, size_t size, npy_array *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    size_t start = 0, hlen = 0, elem = 0;
    if (parse_preamble(b, size, &start, &hlen, err, errlen))
        return -1;
    if (hlen > size - start)
        return fail(err, errlen, "truncated .npy header");
    if (parse_header(b + start, hlen, out, &elem, err, errlen))
        return -1;
    const size_t have = size - start - hlen, need = out->count * elem;
    if (have < need)
        return fail(err, errlen, "truncated: %zu data bytes, the shape needs %zu", have, need);
    if (have > need)
        return fail(err, errlen, "%zu bytes past the data the shape describes", have - need);
    return take_data(b + start + hlen, out, elem, err, errlen);
}

/* Headers this long are no .npy's (NumPy pads them to 64 bytes). */
enum { NPY_MAX_HEADER = 1 << 20 };

int npy_read(const char *path, npy_array *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, errlen, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return fail(err, errlen, "%s: is a folder, not a .npy file", path);
    }
    /* The preamble and the header first, each checked before more is read,
     * then exactly the data the header describes: a stream that is no
     * .npy (/dev/zero) is refused after a few bytes. */
    unsigned char pre[12], *head = NULL, *data = NULL;
    char inner[256];
    size_t start = 0, hlen = 0, elem = 0;
    int rc = -1;
    size_t got = fread(pre, 1, 10, f);
    if (got == 10 && pre[6] >= 2)
        got += fread(pre + 10, 1, 2, f);
    if (parse_preamble(pre, got, &start, &hlen, inner, sizeof inner) == 0) {
        if (hlen > NPY_MAX_HEADER)
            snprintf(inner, sizeof inner, ".npy header of %zu bytes, too long", hlen);
        else if (!(head = malloc(hlen ? hlen : 1)))
            snprintf(inner, sizeof inner, "out of memory");
        else if (fread(head, 1, hlen, f) != hlen)
            snprintf(inner, sizeof inner, "truncated .npy header");
        else if (parse_header(head, hlen, out, &elem, inner, sizeof inner) == 0) {
            const size_t need = out->count * elem;
            unsigned char extra;
            if (!(data = malloc(need ? need : 1)))
                snprintf(inner, sizeof inner, "out of memory for %zu elements", out->count);
            else if ((got = fread(data, 1, need, f)) != need)
                snprintf(inner, sizeof inner, "truncated: %zu data bytes, the shape needs %zu",
                         got, need);
            else if (fread(&extra, 1, 1, f) == 1)
                snprintf(inner, sizeof inner, "bytes past the data the shape describes");
            else if (ferror(f))
                snprintf(inner, sizeof inner, "read error");
            else { /* the data as read is the array's */
                attach(out, data);
                data = NULL;
                rc = 0;
            }
        }
    }
    fclose(f);
    free(head);
    free(data);
    if (rc)
        fail(err, errlen, "%s: %s", path, inner);
    return rc;
}

int npy_write_temp(const char *path, const size_t *shape, int ndim, const char *descr,
                   const void *data, char *tmp, size_t tmplen, char *err, size_t errlen)
{
    const size_t elem = strcmp(descr, "<f4") ? sizeof(uint16_t) : sizeof(float);
    if ((size_t)snprintf(tmp, tmplen, "%s.tmp.XXXXXX", path) >= tmplen)
        return fail(err, errlen, "%s: path too long", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return fail(err, errlen, "%s: cannot create a file beside it: %s", path,
                    strerror(errno));
    /* mkstemp makes the file 0600; give it the permissions a plain create would. */
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%.3s', 'fortran_order': False, 'shape': (",
                     descr);
    size_t count = 1;
    for (int i = 0; i < ndim; ++i) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%zu%s", shape[i],
                      ndim == 1 || i + 1 < ndim ? ", " : "");
        count *= shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* Pad with spaces so the data starts on a 64-byte boundary. */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    unsigned char head[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xFF),
                              (unsigned char)(hlen >> 8)};
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        return fail(err, errlen, "%s: %s", tmp, strerror(errno));
    }
    int ok = fwrite(head, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
    for (size_t i = 0; ok && i < pad; ++i)
        ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF && fwrite(data, elem, count, f) == count;
    ok = (fflush(f) == 0) && ok;
    if (fclose(f) != 0 || !ok) {
        unlink(tmp);
        return fail(err, errlen, "%s: write failed: %s", path, strerror(errno));
    }
    return 0;
}

int npy_commit(const char *tmp, const char *path, char *err, size_t errlen)
{
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return fail(err, errlen, "%s: %s", path, strerror(e));
    }
    return 0;
}

void npy_discard(const char *tmp) { unlink(tmp); }
