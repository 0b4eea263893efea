/* The tuning file (docs/tuning.md): its path, the device key its entries
 * are filed under, reading a device's entries when a context is made, and
 * keeping one entry, which `clattn tune` calls. Each variant parses its own
 * entries (variant.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "variant.h"

/* The tuning file's path: CLATTN_TUNING_FILE ("off": none), else
 * $XDG_CONFIG_HOME/clattn/tuning, else ~/.config/clattn/tuning; 0 where
 * there is none or it is longer than size. */
static int tuning_path(char *path, size_t size)
{
    const char *set = getenv("CLATTN_TUNING_FILE"), *xdg = getenv("XDG_CONFIG_HOME");
    const char *home = getenv("HOME");
    int n;
    if (set && *set)
        n = strcmp(set, "off") ? snprintf(path, size, "%s", set) : -1;
    else if (xdg && *xdg)
        n = snprintf(path, size, "%s/clattn/tuning", xdg);
    else if (home && *home)
        n = snprintf(path, size, "%s/.config/clattn/tuning", home);
    else
        n = -1;
    return n > 0 && (size_t)n < size;
}

static int parse_dtype_name(const char *name, clattn_dtype *dtype)
{
    static const char *const names[3] = {"f32", "f16", "bf16"};
    for (int i = 0; i < 3; ++i)
        if (!strcmp(name, names[i])) {
            *dtype = (clattn_dtype)i;
            return 1;
        }
    return 0;
}

/* One entry line, "VARIANT<TAB>DTYPE<TAB>HEAD_DIM<TAB>SHAPE<TAB>KEY", into
 * *e (a variant's shape) or, for VARIANT `auto`, *c (the default's choice,
 * e->variant NULL), and *key (pointing into line, which it cuts); the
 * reason where it is malformed, else NULL. */
static const char *parse_entry(char *line, tuned_entry *e, choice_entry *c, const char **key,
                               char *msg, size_t size)
{
    char *field[5];
    field[0] = line;
    for (int i = 1; i < 5; ++i) {
        char *tab = strchr(field[i - 1], '\t');
        if (!tab)
            return "want VARIANT, DTYPE, HEAD_DIM, SHAPE and the device, "
                   "tab-separated";
        *tab = '\0';
        field[i] = tab + 1;
    }
    memset(e, 0, sizeof *e);
    char end;
    if (!parse_dtype_name(field[1], &e->dtype))
        return "the dtype is none of f32, f16 and bf16";
    if (sscanf(field[2], "%u%c", &e->head_dim, &end) != 1 || !e->head_dim ||
        e->head_dim > CLATTN_MAX_HEAD_DIM)
        return "the head_dim is not 1 to 256";
    *key = field[4];
    if (!strcmp(field[0], "auto")) {
        c->dtype = e->dtype;
        c->head_dim = e->head_dim;
        return clattn_ocl_parse_choice(field[3], c)
                   ? NULL
                   : "an auto entry's shape is OP,SIZE=VARIANT: forward or backward, short or "
                     "long, and a variant built per head_dim";
    }
    for (size_t i = 0; clattn_ocl_variants[i] && !e->variant; ++i) {
        const clattn_ocl_variant *v = clattn_ocl_variants[i];
        const char *why = NULL;
        if (v->parse_tuned && v->parse_tuned(field[0], field[3], e, &why)) {
            if (why)
                return why;
            e->variant = v;
        }
    }
    if (!e->variant) {
        snprintf(msg, size, "the variant is none of");
        for (size_t i = 0, n = 0; clattn_ocl_variants[i]; ++i)
            if (clattn_ocl_variants[i]->tuned_names)
                clattn_ocl_append(msg, size, "%s %s", n++ ? "," : "",
                                  clattn_ocl_variants[i]->tuned_names);
        clattn_ocl_append(msg, size, ", auto");
        return msg;
    }
    return NULL;
}

void clattn_ocl_tuning_file(struct clattn_cl_state *cl, clattn_context *ctx, const char *key)
{
    char path[1024];
    cl->tuned.count = cl->choices.count = 0;
    if (!tuning_path(path, sizeof path))
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return; /* no file: the tables */
    char line[1024];
    const char *why = NULL;
    char msg[200];
    unsigned number = 1, skipped = 0, other_driver = 0;
    /* The device's key without its driver: entries from another driver are stale. */
    const char *driver = strrchr(key, '/');
    const size_t stem = driver ? (size_t)(driver - key) : strlen(key);
    if (!fgets(line, sizeof line, f)) {
        why = "it is empty";
    } else {
        char version[64];
        line[strcspn(line, "\r\n")] = '\0';
        if (sscanf(line, "clattn-tuning 1 %63s", version) != 1)
            why = "its first line is not 'clattn-tuning 1 VERSION'";
        else if (strcmp(version, clattn_version()))
            why = "it was written by another clattn version (stale)";
    }
    while (!why && fgets(line, sizeof line, f)) {
        ++number;
        const size_t n = strcspn(line, "\r\n");
        if (!line[n] && !feof(f)) {
            why = "a line is too long";
            break;
        }
        line[n] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        tuned_entry e;
        choice_entry c;
        const char *entry_key = NULL;
        if ((why = parse_entry(line, &e, &c, &entry_key, msg, sizeof msg)) != NULL)
            break;
        if (!e.variant) {
            if (strcmp(entry_key, key)) {
                other_driver += !strncmp(entry_key, key, stem) && entry_key[stem] == '/';
                continue;
            }
            size_t i = 0;
            while (i < cl->choices.count &&
                   (cl->choices.entries[i].dtype != c.dtype ||
                    cl->choices.entries[i].head_dim != c.head_dim ||
                    cl->choices.entries[i].op != c.op || cl->choices.entries[i].size != c.size))
                ++i;
            if (i == CHOICES_MAX)
                ++skipped;
            else
                cl->choices.entries[i == cl->choices.count ? cl->choices.count++ : i] = c;
            continue;
        }
        if (e.variant->tuned_fits && !e.variant->tuned_fits(cl, &e)) {
            clattn_log_append(ctx,
                              "tuning: %s, line %u: the %s shape needs more local memory "
                              "than the device has; the entry is ignored",
                              path, number, e.variant->name);
            continue;
        }
        if (strcmp(entry_key, key)) {
            other_driver += !strncmp(entry_key, key, stem) && entry_key[stem] == '/';
            continue; /* another device's */
        }
        tuned_entry *slot =
            (tuned_entry *)clattn_ocl_tuned(cl, e.variant, e.dtype, e.head_dim, e.pass);
        if (!slot && cl->tuned.count == TUNED_MAX) {
            ++skipped;
            continue;
        }
        *(slot ? slot : &cl->tuned.entries[cl->tuned.count++]) = e; /* a later line replaces an earlier */
    }
    if (!why && ferror(f))
        why = "it could not be read";
    fclose(f);
    if (why) {
        cl->tuned.count = cl->choices.count = 0;
        if (number > 1)
            clattn_log_append(ctx, "tuning: %s, line %u: %s; the file is ignored", path, number,
                              why);
        else
            clattn_log_append(ctx, "tuning: %s: %s; the file is ignored", path, why);
        return;
    }
    if (other_driver)
        clattn_log_append(ctx, "tuning: %s: %u entries for this device under another driver "
                          "(stale) are ignored", path, other_driver);
    if (skipped)
        clattn_log_append(ctx, "tuning: %s: %u entries past the first %d are ignored", path,
                          skipped, (int)TUNED_MAX);
    for (size_t i = 0; i < cl->tuned.count; ++i) {
        char shape[160];
        cl->tuned.entries[i].variant->format_tuned(&cl->tuned.entries[i], shape, sizeof shape);
        clattn_log_append(ctx, "tuning: %s from %s", shape, path);
    }
    for (size_t i = 0; i < cl->choices.count; ++i) {
        char shape[160];
        clattn_ocl_format_choice(&cl->choices.entries[i], shape, sizeof shape);
        clattn_log_append(ctx, "tuning: %s from %s", shape, path);
    }
}

clattn_status clattn_tuning_file_path(char *path, size_t size)
{
    clattn_clear_error();
    if (!path)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "path is NULL");
    if (!size || !tuning_path(path, size)) {
        if (size)
            path[0] = '\0';
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "no tuning file: CLATTN_TUNING_FILE is off, or neither it, "
                           "XDG_CONFIG_HOME nor HOME is set, or the path is longer than %zu "
                           "bytes",
                           size);
    }
    return CLATTN_OK;
}

int clattn_ocl_tuning_key(const char *platform, const char *device, const char *driver,
                          char *key, size_t size)
{
    const int n = snprintf(key, size, "%s / %s / %s", platform, device, driver);
    const int ok = n > 0 && (size_t)n < size && !strpbrk(key, "\t\r\n");
    if (!ok)
        key[0] = '\0';
    return ok;
}

clattn_status clattn_context_tuning_key(const clattn_context *ctx, char *key, size_t size)
{
    clattn_clear_error();
    if (!ctx || !key)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, ctx ? "key is NULL" : "ctx is NULL");
    if (!ctx->cl)
        return clattn_fail(CLATTN_ERROR_WRONG_BACKEND,
                           "the tuning file keys OpenCL devices; this context is native");
    const char *own = ctx->cl->tuning_key;
    if (!own[0] || strlen(own) >= size) {
        if (size)
            key[0] = '\0';
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "the device's key does not fit %zu bytes with its terminator, or "
                           "holds a tab or a newline",
                           own[0] ? size : (size_t)TUNING_KEY_MAX);
    }
    memcpy(key, own, strlen(own) + 1);
    return CLATTN_OK;
}

clattn_status clattn_tuning_file_store(const char *path, const char *variant, clattn_dtype dtype,
                                       uint32_t head_dim, const char *shape, const char *key)
{
    clattn_clear_error();
    if (!path || !variant || !shape || !key)
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "path, variant, shape or key is NULL");
    /* The entry, checked as a context reads it. */
    char line[1024], check[1024], msg[200];
    const int len = snprintf(line, sizeof line, "%s\t%s\t%u\t%s\t%s\n", variant,
                             clattn_ocl_dtype_name(dtype), (unsigned)head_dim, shape, key);
    if (len < 0 || (size_t)len >= sizeof line || strpbrk(variant, "\t\r\n") ||
        strpbrk(shape, "\t\r\n") || strpbrk(key, "\t\r\n") || !*key)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "a tuning entry's fields are one line of at most %zu bytes, with no "
                           "tab and a key",
                           sizeof line - 2);
    memcpy(check, line, (size_t)len - 1);
    check[len - 1] = '\0';
    tuned_entry e;
    choice_entry c;
    const char *entry_key, *why = parse_entry(check, &e, &c, &entry_key, msg, sizeof msg);
    if (why)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "tuning entry '%s\t%s\t%u\t%s': %s",
                           variant, clattn_ocl_dtype_name(dtype), (unsigned)head_dim, shape, why);
    /* The file's folder, where missing. */
    char folder[1024];
    snprintf(folder, sizeof folder, "%s", path);
    char *slash = strrchr(folder, '/');
    if (slash && slash != folder) {
        *slash = '\0';
        if (mkdir(folder, 0755) && errno != EEXIST)
            return clattn_fail(CLATTN_ERROR_IO, "cannot create %s: %s", folder, strerror(errno));
    }
    /* The other entries copied, this one's older line left out, into a
     * temporary file renamed over the old one: a failure leaves it whole. A
     * file of another format or clattn version is replaced. */
    char header[64], tmp[1100], text[1024];
    snprintf(header, sizeof header, "clattn-tuning 1 %s\n", clattn_version());
    const int n = snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tmp)
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION, "the tuning file's path is too long");
    FILE *out = fopen(tmp, "w");
    if (!out)
        return clattn_fail(CLATTN_ERROR_IO, "cannot write %s: %s", tmp, strerror(errno));
    fputs(header, out);
    /* "VARIANT\tDTYPE\tD\t", and an auto entry's "OP,SIZE=" */
    const size_t stem = strlen(line) - strlen(shape) - strlen(key) - 2 +
                        (e.variant ? 0 : (size_t)(strchr(shape, '=') + 1 - shape));
    const char *own_key = line + len - 1 - strlen(key) - 1;             /* "\tKEY\n" */
    FILE *in = fopen(path, "r");
    int ends = 1; /* whether what was copied ends its last line */
    if (in && fgets(text, sizeof text, in) && !strcmp(text, header)) {
        while (fgets(text, sizeof text, in)) {
            const char *last = strrchr(text, '\t');
            if (strncmp(text, line, stem) || !last || strcmp(last, own_key)) {
                fputs(text, out);
                ends = text[strlen(text) - 1] == '\n';
            }
        }
    }
    if (in)
        fclose(in);
    if (!ends)
        fputc('\n', out);
    fputs(line, out);
    const int failed = ferror(out);
    if (fclose(out) || failed || rename(tmp, path)) {
        const int err = errno;
        remove(tmp);
        return clattn_fail(CLATTN_ERROR_IO, "cannot write %s: %s", path, strerror(err));
    }
    return CLATTN_OK;
}
