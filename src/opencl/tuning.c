/* The tuning state every variant shares: each variant's setup when a
 * context is made, the program cache's and the dS scratch's bounds, and
 * the tuning file that `clattn tune` writes (docs/tuning.md), whose entries
 * each variant parses. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program_cache.h"
#include "variant.h"

clattn_status clattn_ocl_tuning_init(struct clattn_cl_state *cl, cl_device_id device,
                                     int items_loop)
{
    for (size_t i = 0; clattn_ocl_variants[i]; ++i) {
        const clattn_ocl_variant *v = clattn_ocl_variants[i];
        const clattn_status st = v->setup ? v->setup(cl, device, items_loop) : CLATTN_OK;
        if (st != CLATTN_OK)
            return st;
    }
    uint64_t bound;
    if (!clattn_cache_bound(&bound))
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_CACHE_MAX_MB='%s': want the program cache's bound as a whole "
                           "number of MiB (0: no bound)",
                           getenv("CLATTN_CACHE_MAX_MB"));
    /* CLATTN_DS_MAX_MB: the dS scratch's bound (launch.c's ds_chunk) */
    const char *ds = getenv("CLATTN_DS_MAX_MB");
    cl->ds_max = DS_DEFAULT;
    if (ds) {
        char *end;
        errno = 0;
        const unsigned long long mb = strtoull(ds, &end, 10);
        if (!*ds || *end || errno || ds[0] == '-' || mb >= 1ull << 40)
            return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                               "CLATTN_DS_MAX_MB='%s': want the backward's dS scratch bound as a "
                               "whole number of MiB (0: none)",
                               ds);
        cl->ds_max = (size_t)(mb << 20);
    }
    return CLATTN_OK;
}

/* The tuning file's path: CLATTN_TUNING_FILE ("off": none), else
 * $XDG_CONFIG_HOME/clattn/tuning, else ~/.config/clattn/tuning; 0 where
 * there is none. */
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
 * *e and *key (pointing into line, which it cuts); the reason where it is
 * malformed, else NULL. */
static const char *parse_entry(char *line, tuned_entry *e, const char **key, char *msg, size_t size)
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
        return msg;
    }
    *key = field[4];
    return NULL;
}

void clattn_ocl_tuning_file(struct clattn_cl_state *cl, clattn_context *ctx, const char *key)
{
    char path[1024];
    cl->ntuned = 0;
    if (!tuning_path(path, sizeof path))
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return; /* no file: the tables */
    char line[1024];
    const char *why = NULL;
    char msg[200];
    unsigned number = 1, skipped = 0, other_driver = 0;
    /* The device's key without its driver: entries from another driver are stale.
     */
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
        const char *entry_key = NULL;
        if ((why = parse_entry(line, &e, &entry_key, msg, sizeof msg)) != NULL)
            break;
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
        if (!slot && cl->ntuned == TUNED_MAX) {
            ++skipped;
            continue;
        }
        *(slot ? slot : &cl->tuned[cl->ntuned++]) = e; /* a later line replaces an earlier */
    }
    if (!why && ferror(f))
        why = "it could not be read";
    fclose(f);
    if (why) {
        cl->ntuned = 0;
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
    for (size_t i = 0; i < cl->ntuned; ++i) {
        char shape[160];
        cl->tuned[i].variant->format_tuned(&cl->tuned[i], shape, sizeof shape);
        clattn_log_append(ctx, "tuning: %s from %s", shape, path);
    }
}
