/* A context's log: what creation tried and what it built, one line each.
 * Below every other file: it calls nothing of clattn's. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void clattn_log_append(clattn_context *ctx, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t old = strlen(ctx->log), add = strlen(line);
    char *grown = realloc(ctx->log, old + add + 2);
    if (!grown)
        return; /* the log is advice; losing a line is not worth failing for */
    memcpy(grown + old, line, add);
    grown[old + add] = '\n';
    grown[old + add + 1] = '\0';
    ctx->log = grown;
}
