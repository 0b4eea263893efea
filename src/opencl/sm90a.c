/* PTX made sm_90a (src/sm90a.h): shared by the library and
 * tests/sm90a_probe.c, which tries the route on its own. */
#include "sm90a.h"

#include <stdlib.h>
#include <string.h>

/* s with every `from` replaced by `to`, in new memory (NULL when out of
 * it). */
static char *replace_all(const char *s, const char *from, const char *to)
{
    const size_t lf = strlen(from), lt = strlen(to);
    size_t n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + lf, from))
        ++n;
    char *out = malloc(strlen(s) + n * lt + 1);
    if (!out)
        return NULL;
    char *o = out;
    const char *p = s, *q;
    while ((q = strstr(p, from))) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, lt);
        o += lt;
        p = q + lf;
    }
    strcpy(o, p);
    return out;
}

int clattn_sm90a_ptx(const char *ptx, char **out)
{
    *out = NULL;
    if (!strstr(ptx, ".target sm_90,"))
        return CLATTN_SM90A_NOT_SM90;
    char *target = replace_all(ptx, ".target sm_90,", ".target sm_90a,");
    *out = target ? replace_all(target, CLATTN_SM90A_MARK, "") : NULL;
    free(target);
    return *out ? CLATTN_SM90A_OK : CLATTN_SM90A_NO_MEMORY;
}
