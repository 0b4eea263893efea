/* A shim loaded in front of libc (LD_PRELOAD) that fails rename() with
 * EPERM whenever the new name ends with $FAILRENAME_TO, as an immutable
 * file or another user's file in a sticky folder makes it fail: the CLI's
 * tests use it to fail one output's rename after others succeeded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int rename(const char *from, const char *to)
{
    int (*real)(const char *, const char *);
    *(void **)&real = dlsym(RTLD_NEXT, "rename");
    const char *fail = getenv("FAILRENAME_TO");
    const size_t n = fail ? strlen(fail) : 0, m = strlen(to);
    if (n && m >= n && !strcmp(to + m - n, fail)) {
        errno = EPERM;
        return -1;
    }
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(from, to);
}
