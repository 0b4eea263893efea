/* The on-disk cache of built OpenCL programs: a second context on the same
 * device, in this process or another, loads the device binary instead of
 * compiling the source again.
 *
 * Where: $CLATTN_CACHE_DIR, else $XDG_CACHE_HOME/clattn, else
 * $HOME/.cache/clattn; CLATTN_CACHE_DIR set to "" or "off" turns it off.
 * The key is everything that can change the binary: clattn's version, a hash
 * of the source, the build options, the platform, the device and its
 * driver. A file is named by a hash of its key, and holds the key itself and
 * a checksum of the binary, so a collision, a torn file or bit rot reads as
 * a miss. Files are written under a temporary name and renamed into place,
 * so readers never see half of one. The cache is advice: any failure to
 * read or write it leaves the build to the compiler, never fails a call.
 *
 * Its programs stay within CLATTN_CACHE_MAX_MB MiB (default 1 GiB; 0: no
 * bound): a load refreshes a file's modification time, and a store then
 * removes the least recently used files past the bound, so that the
 * programs of older sources and drivers age out. */
#define CL_TARGET_OPENCL_VERSION 120
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clattn_cl.h"
#include "internal.h"
#include "program_cache.h"

static const char magic[] = "clattn program cache 1\n";

int clattn_cache_bound(uint64_t *bytes)
{
    const char *env = getenv("CLATTN_CACHE_MAX_MB");
    *bytes = 1ull << 30;
    if (!env)
        return 1;
    char *end;
    errno = 0;
    const unsigned long long mb = strtoull(env, &end, 10);
    if (!*env || *end || errno || env[0] == '-' || mb >= 1ull << 40)
        return 0;
    *bytes = (uint64_t)mb << 20;
    return 1;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t hash(const void *data, size_t n) { return fnv1a(0xcbf29ce484222325ull, data, n); }

/* The cache folder into dir, or 0 when there is none. */
static int cache_dir(char *dir, size_t size)
{
    const char *env = getenv("CLATTN_CACHE_DIR");
    int n;
    if (env)
        return *env && strcmp(env, "off") != 0 &&
               (n = snprintf(dir, size, "%s", env)) > 0 && (size_t)n < size;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        n = snprintf(dir, size, "%s/clattn", xdg);
    else if (home && *home)
        n = snprintf(dir, size, "%s/.cache/clattn", home);
    else
        return 0;
    return n > 0 && (size_t)n < size;
}

/* mkdir -p, private to the user where it creates anything. */
static int make_dirs(char *path)
{
    for (char *p = path + 1;; ++p) {
        if (*p != '/' && *p != '\0')
            continue;
        const char saved = *p;
        *p = '\0';
        const int ok = mkdir(path, 0700) == 0 || errno == EEXIST;
        *p = saved;
        if (!ok)
            return 0;
        if (saved == '\0')
            return 1;
    }
}

static void info_string(cl_device_id device, cl_device_info what, char *out, size_t size)
{
    if (clGetDeviceInfo(device, what, size, out, NULL) != CL_SUCCESS)
        snprintf(out, size, "?");
    out[size - 1] = '\0';
}

/* The key of a build, and the file it lives in. 0 when there is no cache. */
static int key_and_path(cl_device_id device, const char *source, const char *options,
                        char *key, size_t key_size, char *path, size_t path_size)
{
    char dir[1024];
    if (!cache_dir(dir, sizeof dir))
        return 0;
    char name[256], version[256], driver[256], vendor[256], platform_name[256],
        platform_version[256];
    cl_platform_id platform = NULL;
    info_string(device, CL_DEVICE_NAME, name, sizeof name);
    info_string(device, CL_DEVICE_VERSION, version, sizeof version);
    info_string(device, CL_DRIVER_VERSION, driver, sizeof driver);
    info_string(device, CL_DEVICE_VENDOR, vendor, sizeof vendor);
    snprintf(platform_name, sizeof platform_name, "?");
    snprintf(platform_version, sizeof platform_version, "?");
    if (clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL) ==
        CL_SUCCESS) {
        clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof platform_name, platform_name, NULL);
        clGetPlatformInfo(platform, CL_PLATFORM_VERSION, sizeof platform_version,
                          platform_version, NULL);
        platform_name[sizeof platform_name - 1] = platform_version[sizeof platform_version - 1] =
            '\0';
    }
    int n = snprintf(key, key_size,
                     "clattn %s\nsource %016llx\noptions %s\nplatform %s / %s\n"
                     "device %s / %s / %s\ndriver %s\n",
                     clattn_version(), (unsigned long long)hash(source, strlen(source)), options,
                     platform_name, platform_version, vendor, name, version, driver);
    if (n < 0 || (size_t)n >= key_size)
        return 0;
    n = snprintf(path, path_size, "%s/%016llx.bin", dir, (unsigned long long)hash(key, strlen(key)));
    return n > 0 && (size_t)n < path_size;
}

/* The file: magic, key, NUL, 8-byte little-endian length, 8-byte checksum,
 * binary. */
static void put_u64(unsigned char *p, uint64_t x)
{
    for (int i = 0; i < 8; ++i)
        p[i] = (unsigned char)(x >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t x = 0;
    for (int i = 0; i < 8; ++i)
        x |= (uint64_t)p[i] << (8 * i);
    return x;
}

/* Reads a whole file (at most 256 MiB) into a new buffer. */
static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *buf = NULL;
    long n;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && n < (256l << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) != NULL &&
        fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        *size = (size_t)n;
    return buf;
}

cl_program clattn_cache_load(cl_context context, cl_device_id device, const char *source,
                             const char *options)
{
    char key[2048], path[1200];
    if (!key_and_path(device, source, options, key, sizeof key, path, sizeof path))
        return NULL;
    size_t size = 0;
    unsigned char *buf = read_file(path, &size);
    if (!buf)
        return NULL;
    const size_t ml = strlen(magic), kl = strlen(key), head = ml + kl + 1 + 16;
    cl_program program = NULL;
    if (size > head && !memcmp(buf, magic, ml) && !memcmp(buf + ml, key, kl + 1)) {
        const uint64_t len = get_u64(buf + ml + kl + 1), sum = get_u64(buf + ml + kl + 9);
        const unsigned char *bin = buf + head;
        if (len == size - head && sum == hash(bin, (size_t)len)) {
            const size_t bin_len = (size_t)len;
            cl_int status = CL_SUCCESS, err;
            program = clCreateProgramWithBinary(context, 1, &device, &bin_len, &bin, &status,
                                                &err);
            if (err != CL_SUCCESS || status != CL_SUCCESS) {
                if (program)
                    clReleaseProgram(program);
                program = NULL;
            } else if (clBuildProgram(program, 1, &device, options, NULL, NULL) != CL_SUCCESS) {
                clReleaseProgram(program);
                program = NULL;
            }
        }
    }
    free(buf);
    if (program)
        utimensat(AT_FDCWD, path, NULL, 0); /* recently used; a read-only folder keeps its time */
    return program;
}

/* A cache file's name: 16 hex digits and ".bin". */
static int cache_name(const char *name)
{
    return strlen(name) == 20 && strspn(name, "0123456789abcdef") == 16 &&
           !strcmp(name + 16, ".bin");
}

typedef struct cached {
    char name[21];
    uint64_t size;
    time_t used;
} cached;

static int least_recent_first(const void *a, const void *b)
{
    const cached *x = a, *y = b;
    return (x->used > y->used) - (x->used < y->used);
}

/* Removes the least recently used programs of dir until they fit the
 * bound, never `keep` (the file just stored). Best effort, as all of the
 * cache. */
static void trim(const char *dir, const char *keep)
{
    uint64_t bound, total = 0;
    if (!clattn_cache_bound(&bound) || bound == 0)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    cached *list = NULL;
    size_t n = 0, cap = 0;
    char path[1300];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        struct stat st;
        if (!cache_name(e->d_name) ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path ||
            stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (!strcmp(e->d_name, keep)) { /* counted, never removed */
            total += (uint64_t)st.st_size;
            continue;
        }
        if (n == cap) {
            cached *more = realloc(list, (cap = cap ? 2 * cap : 64) * sizeof *list);
            if (!more)
                break;
            list = more;
        }
        snprintf(list[n].name, sizeof list[n].name, "%s", e->d_name);
        list[n].size = (uint64_t)st.st_size;
        list[n].used = st.st_mtime;
        total += list[n++].size;
    }
    closedir(d);
    if (list && total > bound) {
        qsort(list, n, sizeof *list, least_recent_first);
        for (size_t i = 0; i < n && total > bound; ++i) {
            snprintf(path, sizeof path, "%s/%s", dir, list[i].name);
            if (remove(path) == 0)
                total -= list[i].size;
        }
    }
    free(list);
}

int clattn_cache_store(cl_program program, cl_device_id device, const char *source,
                       const char *options)
{
    char key[2048], path[1200], tmp[1300];
    if (!key_and_path(device, source, options, key, sizeof key, path, sizeof path))
        return 0;
    cl_uint ndev = 0;
    size_t len = 0;
    if (clGetProgramInfo(program, CL_PROGRAM_NUM_DEVICES, sizeof ndev, &ndev, NULL) !=
            CL_SUCCESS ||
        ndev != 1 ||
        clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) !=
            CL_SUCCESS ||
        len == 0)
        return 0;
    const size_t ml = strlen(magic), kl = strlen(key), head = ml + kl + 1 + 16;
    unsigned char *buf = malloc(head + len);
    if (!buf)
        return 0;
    unsigned char *bin = buf + head;
    int ok = clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) ==
             CL_SUCCESS;
    if (ok) {
        memcpy(buf, magic, ml);
        memcpy(buf + ml, key, kl + 1);
        put_u64(buf + ml + kl + 1, len);
        put_u64(buf + ml + kl + 9, hash(bin, len));
        /* The folder of path, created if need be. */
        char dir[1200];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir)
            *slash = '\0';
        ok = make_dirs(dir);
    }
    FILE *f = NULL;
    if (ok) {
        /* Unique per process and call: two writers never share a file. */
        static atomic_uint serial;
        snprintf(tmp, sizeof tmp, "%s.%ld.%u.tmp", path, (long)getpid(),
                 atomic_fetch_add(&serial, 1));
        f = fopen(tmp, "wb");
        ok = f != NULL;
    }
    if (ok) {
        ok = fwrite(buf, 1, head + len, f) == head + len;
        ok = fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) != 0) {
            remove(tmp);
            ok = 0;
        }
    }
    free(buf);
    if (ok) {
        char *slash = strrchr(path, '/');
        *slash = '\0';
        trim(path, slash + 1);
    }
    return ok;
}
