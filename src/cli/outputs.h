/* The file commands' outputs, written all or none: each under a temporary
 * name beside it, then renamed together once every one is written. */
#ifndef CLATTN_CLI_OUTPUTS_H
#define CLATTN_CLI_OUTPUTS_H

#include <stddef.h>

/* The most files a command writes: backward's dQ, dK, dV, d sinks, d bias
 * and d score params. */
enum { MAX_OUTPUTS = 6 };

/* An output array and where it goes. */
typedef struct output {
    const char *path;
    const size_t *shape;
    int ndim;
    const char *descr;
    void *data;
} output;

/* Checks before anything is computed or written that every output can be
 * renamed into place: its folder exists, it is not a folder or other
 * non-file, and no two outputs name the same file. Prints one line and
 * returns 0 otherwise. */
int check_outputs(const char *cmd, const char *const *flags, const char *const *paths,
                  int n);

/* Writes every output to a temporary beside it, checks again that each
 * can take its place, then renames them all together (commit_all); on any
 * failure removes every temporary, so no output is left and no existing
 * file is changed. An output that names an input replaces it only then,
 * after every input was read. */
int write_outputs(const char *cmd, const char *const *flags, const output *outs, int n);

#endif
