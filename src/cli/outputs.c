/* Writing the file commands' outputs all or none (outputs.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"
#include "outputs.h"

/* Where path would be written: its folder's real path and its last name,
 * so that two spellings of one file compare equal; 0 where the folder is
 * missing. */
static int resolve(const char *path, char *out, size_t size)
{
    char dir[PATH_MAX], base[PATH_MAX], real[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir ||
        snprintf(base, sizeof base, "%s", path) >= (int)sizeof base)
        return 0;
    if (!realpath(dirname(dir), real))
        return 0;
    return snprintf(out, size, "%s/%s", real, basename(base)) < (int)size;
}

int check_outputs(const char *cmd, const char *const *flags, const char *const *paths,
                  int n)
{
    char where[MAX_OUTPUTS][PATH_MAX + 1];
    struct stat st[MAX_OUTPUTS];
    int exists[MAX_OUTPUTS];
    for (int i = 0; i < n; ++i) {
        if (!*paths[i]) {
            fprintf(stderr, "clattn %s: %s is an empty path\n", cmd, flags[i]);
            return 0;
        }
        exists[i] = stat(paths[i], &st[i]) == 0;
        if (exists[i] && !S_ISREG(st[i].st_mode)) {
            fprintf(stderr, "clattn %s: %s %s: %s\n", cmd, flags[i], paths[i],
                    S_ISDIR(st[i].st_mode) ? "is a folder" : "is not a regular file");
            return 0;
        }
        if (!resolve(paths[i], where[i], sizeof where[i])) {
            fprintf(stderr, "clattn %s: %s %s: its folder does not exist\n", cmd, flags[i],
                    paths[i]);
            return 0;
        }
        for (int j = 0; j < i; ++j)
            if (!strcmp(where[i], where[j]) ||
                (exists[i] && exists[j] && st[i].st_dev == st[j].st_dev &&
                 st[i].st_ino == st[j].st_ino)) {
                fprintf(stderr, "clattn %s: %s and %s name the same file, %s\n", cmd, flags[j],
                        flags[i], paths[i]);
                return 0;
            }
    }
    return 1;
}

/* Renames the temporaries into place as one step: an existing output is
 * first moved aside under a name of its own, and only removed once every
 * output is in place. When any rename fails, what was renamed is undone
 * (the old files put back, the new ones removed) and the message says what
 * became of each output. Returns 0 after printing that message. */
static int commit_all(const char *cmd, const char *const *flags, const output *outs,
                      char tmp[][PATH_MAX + 16], int n)
{
    char old[MAX_OUTPUTS][PATH_MAX + 16];
    int had[MAX_OUTPUTS] = {0}, existed[MAX_OUTPUTS] = {0}, done = 0, failed = -1, e = 0;
    for (int i = 0; i < n; ++i) {
        struct stat st;
        existed[i] = lstat(outs[i].path, &st) == 0;
    }
    for (; done < n; ++done) {
        const char *path = outs[done].path;
        if (existed[done]) {
            int fd = -1;
            if ((size_t)snprintf(old[done], sizeof old[done], "%s.old.XXXXXX", path) <
                sizeof old[done])
                fd = mkstemp(old[done]);
            if (fd < 0 || rename(path, old[done]) != 0) {
                e = errno;
                if (fd >= 0)
                    unlink(old[done]);
                failed = done;
                if (fd >= 0)
                    close(fd);
                break;
            }
            close(fd);
            had[done] = 1;
        }
        if (rename(tmp[done], path) != 0) {
            e = errno;
            if (had[done] && rename(old[done], path) == 0)
                had[done] = 0;
            failed = done;
            break;
        }
    }
    if (failed < 0) {
        for (int i = 0; i < n; ++i)
            if (had[i])
                unlink(old[i]);
        return 1;
    }
    char msg[2048];
    int len = snprintf(msg, sizeof msg, "clattn %s: %s %s: %s; no output was written:", cmd,
                       flags[failed], outs[failed].path, strerror(e));
    for (int i = 0; i < n; ++i) {
        const char *state;
        if (i < failed) { /* renamed into place: undo it */
            if (had[i])
                state = rename(old[i], outs[i].path) == 0 ? "restored as it was"
                                                          : "NOT restored: its old content is in";
            else
                state = unlink(outs[i].path) == 0 ? "not created" : "left behind";
        } else {
            unlink(tmp[i]);
            state = had[i] ? "NOT restored: its old content is in"
                           : existed[i] ? "left as it was" : "not created";
        }
        if (len < (int)sizeof msg)
            len += snprintf(msg + len, sizeof msg - (size_t)len, "%s %s %s %s%s%s",
                            i ? ";" : "", flags[i], outs[i].path, state,
                            strstr(state, "NOT") ? " " : "", strstr(state, "NOT") ? old[i] : "");
    }
    fprintf(stderr, "%s\n", msg);
    return 0;
}

int write_outputs(const char *cmd, const char *const *flags, const output *outs, int n)
{
    char tmp[MAX_OUTPUTS][PATH_MAX + 16], err[512];
    int made = 0, ok = 1;
    for (; made < n && ok; ++made)
        ok = npy_write_temp(outs[made].path, outs[made].shape, outs[made].ndim, outs[made].descr,
                            outs[made].data, tmp[made], sizeof tmp[made], err, sizeof err) == 0;
    if (!ok) {
        --made; /* the failed one removed its own temporary */
        for (int i = 0; i < made; ++i)
            npy_discard(tmp[i]);
        fprintf(stderr, "clattn %s: %s\n", cmd, err);
        return 0;
    }
    const char *paths[MAX_OUTPUTS] = {NULL};
    for (int i = 0; i < n; ++i)
        paths[i] = outs[i].path;
    if (!check_outputs(cmd, flags, paths, n)) { /* changed while the op ran */
        for (int i = 0; i < n; ++i)
            npy_discard(tmp[i]);
        return 0;
    }
    return commit_all(cmd, flags, outs, tmp, n);
}
