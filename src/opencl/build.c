/* Building a variant's programs: the prelude and the variant's source as one
 * text, the defines each kernel takes from its shape, the program cache, and
 * the sm_90a route for wgmma. Each kernel is checked against the device's
 * and the built kernel's limits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clattn_kernels.h"
#include "program_cache.h"
#include "sm90a.h"
#include "variant.h"

/* Kernels need -cl-std=CL1.2: NVIDIA reports OpenCL 3.0 but compiles C 1.2
 * only. No fast-math: masks and empty rows rely on huge negatives. */
static const char build_options[] = "-cl-std=CL1.2";

/* Loads src from the program cache, or compiles and stores it. */
static clattn_status compile(struct clattn_cl_state *cl, const clattn_ocl_variant *v,
                             const char *function, const char *src, const char *options,
                             cl_program *out)
{
    cl_int err;
    if (cl->program_cache &&
        (*out = clattn_cache_load(cl->context, cl->device, src, options)) != NULL) {
        clattn_log_append(cl->owner, "%s kernels (%s): loaded from the program cache", v->name,
                          options);
        return CLATTN_OK;
    }
    *out = clCreateProgramWithSource(cl->context, 1, &src, NULL, &err);
    if (err != CL_SUCCESS) {
        *out = NULL;
        return clattn_ocl_fail(err, "clCreateProgramWithSource");
    }
    err = clBuildProgram(*out, 1, &cl->device, options, NULL, NULL);
    if (err == CL_SUCCESS) {
        const int stored =
            cl->program_cache && clattn_cache_store(*out, cl->device, src, options);
        clattn_log_append(cl->owner, "%s kernels (%s): compiled%s", v->name, options,
                          stored ? ", stored in the program cache" : "");
        return CLATTN_OK;
    }
    clattn_status st =
        clattn_fail(CLATTN_ERROR_BUILD_FAILED,
                    "building %s of variant '%s' (%s) failed: %s (%d); build log:", function,
                    v->name, options, clattn_ocl_error_name(err), err);
    size_t len = 0;
    clGetProgramBuildInfo(*out, cl->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
    char *log = len ? malloc(len + 1) : NULL;
    if (log && clGetProgramBuildInfo(*out, cl->device, CL_PROGRAM_BUILD_LOG, len, log, NULL) ==
                   CL_SUCCESS) {
        log[len] = '\0';
        clattn_fail_append(log);
    }
    free(log);
    return st;
}

/* cl/mma's WGMMA programs: NVIDIA's OpenCL compiles them for sm_90 with
 * their sm_90a instructions in comments marked SM90A; *program is replaced
 * by the same PTX built for sm_90a with the markers taken out (src/sm90a.c;
 * tests/sm90a_probe.c tries the route). */
static clattn_status retarget_sm90a(struct clattn_cl_state *cl, cl_program *program)
{
    size_t size = 0;
    char *ptx = NULL, *opened = NULL;
    cl_int err = clGetProgramInfo(*program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL);
    if (err == CL_SUCCESS && (!size || !(ptx = calloc(size + 1, 1))))
        err = CL_OUT_OF_HOST_MEMORY;
    if (err == CL_SUCCESS)
        err = clGetProgramInfo(*program, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL);
    clattn_status st =
        err == CL_SUCCESS ? CLATTN_OK : clattn_ocl_fail(err, "clGetProgramInfo(PTX)");
    const int made = st == CLATTN_OK ? clattn_sm90a_ptx(ptx, &opened) : CLATTN_SM90A_OK;
    if (made == CLATTN_SM90A_NOT_SM90)
        st = clattn_fail(CLATTN_ERROR_BUILD_FAILED, "wgmma: the program's PTX is not for sm_90");
    else if (made == CLATTN_SM90A_NO_MEMORY)
        st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    if (st == CLATTN_OK) {
        const size_t len = strlen(opened) + 1;
        const unsigned char *bin = (const unsigned char *)opened;
        cl_int status;
        cl_program p =
            clCreateProgramWithBinary(cl->context, 1, &cl->device, &len, &bin, &status, &err);
        if (err == CL_SUCCESS &&
            (err = clBuildProgram(p, 1, &cl->device, "", NULL, NULL)) != CL_SUCCESS)
            clReleaseProgram(p);
        if (err == CL_SUCCESS) {
            clReleaseProgram(*program);
            *program = p;
        } else {
            st = clattn_fail(CLATTN_ERROR_BUILD_FAILED, "wgmma: building the sm_90a PTX: %s (%d)",
                             clattn_ocl_error_name(err), err);
        }
    }
    free(ptx);
    free(opened);
    return st;
}

/* Where the caller's functions lie in a program in which they (user_text)
 * start at line `line`, for a build log whose compiler numbers the
 * program's own lines (NVIDIA's ignores #line): "; score_fn is the
 * program's lines 40-42". */
static void user_lines(const char *user, unsigned line, char *out, size_t n)
{
    out[0] = '\0';
    unsigned first = 0, last = 0; /* last: the last line with text */
    const char *name = NULL;
    for (const char *p = user;; ++p) {
        const int end = *p == '\0';
        if (end || !strncmp(p, "#line 1 \"", 9)) {
            if (name && last > first)
                snprintf(out + strlen(out), n - strlen(out), "; %.*s is the program's lines %u-%u",
                         (int)strcspn(name, "\""), name, first + 1, last);
            if (end)
                return;
            name = p + 9;
            first = last = line;
        }
        if (*p == '\n')
            ++line;
        else if (line > last)
            last = line;
    }
}

static clattn_status build_program(struct clattn_cl_state *cl, const clattn_ocl_variant *v,
                                   const char *function, const char *defines, const char *user,
                                   cl_program *out)
{
    /* CLATTN_CL_OPTIONS adds the caller's own compiler options. */
    const char *extra = getenv("CLATTN_CL_OPTIONS");
    char options[512];
    snprintf(options, sizeof options, "%s %s", defines, extra ? extra : "");
    /* softcap's tanh (which the caller's functions may call), the
     * caller's functions, the prelude, then the source, as one text: the
     * cache's key covers them all. */
    const size_t tanh_part = strlen(clattn_cl_tanh), first = user ? strlen(user) : 0,
                 prelude = strlen(clattn_cl_common), body = strlen(v->source);
    char *src = malloc(tanh_part + first + prelude + body + 1);
    if (!src)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    memcpy(src, clattn_cl_tanh, tanh_part);
    memcpy(src + tanh_part, user ? user : "", first);
    memcpy(src + tanh_part + first, clattn_cl_common, prelude);
    memcpy(src + tanh_part + first + prelude, v->source, body + 1);
    clattn_status st = compile(cl, v, function, src, options, out);
    free(src);
    if (st == CLATTN_ERROR_BUILD_FAILED && first) {
        char where[256];
        unsigned line = 1;
        for (const char *p = clattn_cl_tanh; *p; ++p)
            line += *p == '\n';
        user_lines(user, line, where, sizeof where);
        clattn_fail_append(where);
    }
    if (st == CLATTN_OK && strstr(options, "-DWGMMA=1") && !cl->mma.emulate &&
        (st = retarget_sm90a(cl, out)) != CLATTN_OK) {
        clReleaseProgram(*out);
        *out = NULL;
    }
    return st;
}

/* CLATTN_LOCAL_PROBE=1 (tests): builds kernel `function`'s program again
 * with -DLOCAL_PROBE, whose kernel FUNCTION_local holds the buffer that
 * the kernel's own defines lay out (cl/common.cl's LOCAL_PROBE_KERNEL),
 * and refuses a `bytes` that the compiler's figure for it exceeds. A
 * family without probes (tree, blocked: no laid-out buffer) passes. */
static clattn_status probe_local(struct clattn_cl_state *cl, const clattn_ocl_variant *family,
                                 const char *function, const char *options, const char *user,
                                 size_t bytes)
{
    char probe_options[400], name[64];
    snprintf(probe_options, sizeof probe_options, "%s -DLOCAL_PROBE", options);
    snprintf(name, sizeof name, "%s_local", function);
    cl_program program = NULL;
    clattn_status st = build_program(cl, family, function, probe_options, user, &program);
    if (st != CLATTN_OK)
        return st;
    /* What the implementation adds to any kernel's figure (a few bytes on
     * some), from a probe of one float, comes off the figure. */
    cl_int err = CL_SUCCESS;
    cl_ulong laid_out = 0, base = 0;
    const char *names[2] = {name, "local_probe_base_local"};
    cl_ulong *sizes[2] = {&laid_out, &base};
    for (int i = 0; i < 2 && err == CL_SUCCESS; ++i) {
        cl_kernel kernel = clCreateKernel(program, names[i], &err);
        if (err == CL_SUCCESS) {
            err = clGetKernelWorkGroupInfo(kernel, cl->device, CL_KERNEL_LOCAL_MEM_SIZE,
                                           sizeof *sizes[i], sizes[i], NULL);
            clReleaseKernel(kernel);
        }
    }
    clReleaseProgram(program);
    if (err == CL_SUCCESS && base > sizeof(float))
        laid_out -= base - sizeof(float);
    if (err == CL_INVALID_KERNEL_NAME)
        return CLATTN_OK;
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clGetKernelWorkGroupInfo(probe)");
    if (laid_out > bytes)
        return clattn_fail(CLATTN_ERROR_BUILD_FAILED,
                           "%s (%s) lays out %llu bytes of local memory; the host gives it %zu",
                           function, options, (unsigned long long)laid_out, bytes);
    clattn_log_append(cl->owner, "%s: local buffer of %zu bytes, %llu laid out", function, bytes,
                      (unsigned long long)laid_out);
    return CLATTN_OK;
}

/* The options kernel k of a family is built with for a head_dim (0: any):
 * what every program takes, and the family's defines. */
static const char *kernel_options(const struct clattn_cl_state *cl,
                                  const clattn_ocl_variant *family, uint32_t head_dim,
                                  clattn_dtype dtype, unsigned mods, int k, size_t limit, char *buf,
                                  size_t size)
{
    snprintf(buf, size, "%s -DHEAD_DIM=%u", build_options, head_dim ? head_dim : 1u);
    family->defines(cl, head_dim, dtype, k, limit, buf, size);
    clattn_ocl_append(buf, size, " -DDTYPE=%d", (int)dtype);
    if (mods)
        clattn_ocl_append(buf, size, " -DMODS=%u", mods);
    return buf;
}

/* Whether an optional kernel k is built into the set: the variant and the
 * kernel's family agree. */
static int builds(const struct clattn_cl_state *cl, const clattn_ocl_variant *variant,
                  const kernel_set *set, uint32_t head_dim, int k)
{
    const clattn_ocl_variant *family = variant->kernels[k].family;
    return (!variant->builds || variant->builds(cl, set, head_dim, k)) &&
           (!family->builds || family->builds(cl, set, head_dim, k));
}

/* One try at building a variant's kernels under set->limit. A kernel of a
 * family that fits its shapes to the limit, allowing fewer work-items than
 * its shape needs (the compiler's registers can lower the device's limit),
 * sets *lower to what it allows, for a try with that limit. */
static clattn_status build_set_once(struct clattn_cl_state *cl, const clattn_ocl_variant *variant,
                                    uint32_t head_dim, clattn_dtype dtype, unsigned mods,
                                    kernel_set *set, int strict_limits, size_t *lower)
{
    set->dtype = dtype;
    set->mods = mods;
    for (int k = 0; k < K_COUNT; ++k) {
        const clattn_ocl_kernel *v = &variant->kernels[k];
        const int optional = k == K_GRAD_KV || k == K_GRAD_KVQ || k == K_FINISH_DQ ||
                             k == K_GRAD_KVS || k == K_GRAD_QS || k == K_SUM_PARTS ||
                             k == K_GRAD_BIAS || k == K_GRAD_PARAMS;
        if (!v->function && !optional)
            return clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT, "variant '%s' has no kernel %d",
                               variant->name, k);
        /* without a stand-in the backward runs GRAD_K and GRAD_V, or two passes */
        if (!v->function || (optional && !builds(cl, variant, set, head_dim, k)))
            continue;
        const clattn_ocl_variant *family = v->family;
        set->family[k] = family;
        clattn_status st = family->check ? family->check(cl, head_dim, dtype, k) : CLATTN_OK;
        if (st != CLATTN_OK)
            return st;
        char options[384], other[384];
        kernel_options(cl, family, head_dim, dtype, mods, k, set->limit, options, sizeof options);
        for (int j = 0; j < k && !set->program[k]; ++j) {
            if (set->program[j] && set->family[j]->source == family->source &&
                !strcmp(options, kernel_options(cl, set->family[j], head_dim, dtype, mods, j,
                                                set->limit, other, sizeof other))) {
                /* shared only once retained: releasing the set releases it twice */
                const cl_int err = clRetainProgram(set->program[j]);
                if (err != CL_SUCCESS)
                    return clattn_ocl_fail(err, "clRetainProgram");
                set->program[k] = set->program[j];
            }
        }
        if (!set->program[k] &&
            (st = build_program(cl, family, v->function, options, set->user, &set->program[k])) !=
                CLATTN_OK)
            return st;
        cl_int err;
        set->function[k] = v->function;
        memcpy(set->options[k], options, sizeof options);
        set->kernel[k] = clCreateKernel(set->program[k], v->function, &err);
        if (err != CL_SUCCESS) {
            set->kernel[k] = NULL;
            return clattn_ocl_fail(err, "clCreateKernel");
        }
        if ((err = clGetKernelWorkGroupInfo(set->kernel[k], cl->device, CL_KERNEL_WORK_GROUP_SIZE,
                                            sizeof(size_t), &set->max_wg[k], NULL)) ||
            (err = clGetKernelWorkGroupInfo(set->kernel[k], cl->device, CL_KERNEL_LOCAL_MEM_SIZE,
                                            sizeof(cl_ulong), &set->local_mem[k], NULL)))
            return clattn_ocl_fail(err, "clGetKernelWorkGroupInfo");
        const uint32_t largest = head_dim ? head_dim : CLATTN_MAX_HEAD_DIM;
        const size_t wg = clattn_ocl_work_group(cl, set, k, largest);
        const size_t local = clattn_ocl_local_bytes(cl, set, k, largest);
        if (cl->local_probe &&
            (st = probe_local(cl, family, v->function, options, set->user, local)) != CLATTN_OK)
            return st;
        if (family->fits_limit && set->max_wg[k] < wg && set->max_wg[k] >= 1) {
            *lower = set->max_wg[k];
            return CLATTN_ERROR_WORK_GROUP_TOO_LARGE;
        }
        if ((strict_limits || !family->lenient_limits) &&
            (set->max_wg[k] < wg || cl->limits.local_mem < set->local_mem[k] + local))
            return clattn_fail(CLATTN_ERROR_WORK_GROUP_TOO_LARGE,
                               "%s needs work-groups of %zu and %zu bytes of local memory; "
                               "the device allows %zu and %llu",
                               v->function, wg, local, set->max_wg[k],
                               (unsigned long long)cl->limits.local_mem);
    }
    return CLATTN_OK;
}

clattn_status clattn_ocl_build_set(struct clattn_cl_state *cl, const clattn_ocl_variant *variant,
                                   uint32_t head_dim, clattn_dtype dtype, unsigned mods,
                                   kernel_set *set, int strict_limits)
{
    size_t limit = cl->limits.max_wg;
    char *user = set->user; /* the caller's, kept */
    for (;;) {
        memset(set, 0, sizeof *set);
        set->user = user;
        set->limit = limit;
        size_t lower = 0;
        const clattn_status st =
            build_set_once(cl, variant, head_dim, dtype, mods, set, strict_limits, &lower);
        if (!lower)
            return st;
        clattn_log_append(cl->owner, "%s kernels at head_dim %u: a kernel allows work-groups "
                          "of %zu, not %zu; building them again for that",
                          variant->name, head_dim, lower, limit);
        clattn_ocl_release_set(set);
        limit = lower;
    }
}

void clattn_ocl_release_set(kernel_set *set)
{
    for (int k = 0; k < K_COUNT; ++k) {
        if (set->kernel[k])
            clReleaseKernel(set->kernel[k]);
        if (set->program[k])
            clReleaseProgram(set->program[k]);
    }
}

clattn_status clattn_ocl_generic_kernels(struct clattn_cl_state *cl, clattn_dtype dtype,
                                         unsigned mods, kernel_set **out)
{
    kernel_set *set = &cl->kernels.any_head_dim[mods][dtype];
    if (!cl->kernels.any_built[mods][dtype]) {
        clattn_status st =
            clattn_ocl_build_set(cl, clattn_ocl_generic_variant(), 0, dtype, mods, set, 0);
        if (st != CLATTN_OK) {
            clattn_ocl_release_set(set);
            memset(set, 0, sizeof *set);
            return st;
        }
        cl->kernels.any_built[mods][dtype] = 1;
    }
    *out = set;
    return CLATTN_OK;
}

clattn_status clattn_ocl_kernels_for(struct clattn_cl_state *cl, const clattn_ocl_variant *variant,
                                     const char *reason, uint32_t head_dim, clattn_dtype dtype,
                                     unsigned mods, kernel_set **out)
{
    if (!variant)
        return clattn_ocl_generic_kernels(cl, dtype, mods, out);
    if (variant->serving)
        variant = variant->serving(head_dim, dtype);
    kernel_set **slot = &cl->kernels.per_head_dim[mods][dtype][head_dim];
    while (*slot && (*slot)->variant != variant)
        slot = &(*slot)->next;
    if (!*slot) {
        kernel_set *set = calloc(1, sizeof *set);
        if (!set)
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
        clattn_status st = clattn_ocl_build_set(cl, variant, head_dim, dtype, mods, set, 0);
        if (st != CLATTN_OK) {
            clattn_ocl_release_set(set);
            free(set);
            return st;
        }
        set->variant = variant;
        *slot = set;
        if (reason)
            clattn_log_append(cl->owner, "auto: %s at head_dim %u (%s): %s", variant->name,
                              (unsigned)head_dim, clattn_ocl_dtype_name(dtype), reason);
    }
    *out = *slot;
    return CLATTN_OK;
}

/* The caller's functions as the text of their programs (after softcap's
 * tanh): each source from its own line 1, so that the compiler's log
 * points into it. */
static char *user_text(const clattn_shape *s, unsigned mods)
{
    const char *score = mods & CLATTN_MOD_SCORE ? s->score_fn : "";
    const char *mask = mods & CLATTN_MOD_MASK ? s->mask_fn : "";
    static const char score_line[] = "#line 1 \"score_fn\"\n", mask_line[] =
                                                                  "#line 1 \"mask_fn\"\n";
    const size_t n = strlen(score_line) + strlen(score) + strlen(mask_line) + strlen(mask) + 8;
    char *text = malloc(n);
    if (text)
        snprintf(text, n, "%s%s\n%s%s\n", score[0] ? score_line : "", score,
                 mask[0] ? mask_line : "", mask);
    return text;
}

/* The kernels of a variant (NULL: the generic one) with the caller's
 * functions: a set per variant, head_dim, dtype, modifiers and text, kept
 * most recently used first, at most USER_SETS_MAX of them. */
static clattn_status user_kernels(struct clattn_cl_state *cl, const clattn_ocl_variant *variant,
                                  const char *reason, const clattn_shape *s, unsigned mods,
                                  kernel_set **out)
{
    if ((mods & CLATTN_MOD_SCORE) && !s->score_fn)
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "the score function has no OpenCL C source (shape.score_fn): the "
                           "OpenCL backends compile it; score_native is native's");
    if ((mods & CLATTN_MOD_MASK) && !s->mask_fn)
        return clattn_fail(CLATTN_ERROR_UNSUPPORTED_SHAPE,
                           "the mask function has no OpenCL C source (shape.mask_fn): the "
                           "OpenCL backends compile it; mask_native is native's");
    if (variant && variant->serving)
        variant = variant->serving(s->head_dim, s->dtype);
    const clattn_ocl_variant *family = variant ? variant : clattn_ocl_generic_variant();
    const uint32_t head_dim = variant && variant->per_head_dim ? s->head_dim : 0;
    char *text = user_text(s, mods);
    if (!text)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    kernel_set **slot = &cl->kernels.user;
    size_t kept = 0;
    for (; *slot; slot = &(*slot)->next, ++kept) {
        const kernel_set *k = *slot;
        if (k->variant == family && k->head_dim == head_dim && k->dtype == s->dtype &&
            k->mods == mods && !strcmp(k->user, text))
            break;
    }
    kernel_set *set = *slot;
    if (set) {
        free(text);
        *slot = set->next; /* to the front */
    } else {
        if (!(set = calloc(1, sizeof *set))) {
            free(text);
            return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
        }
        set->user = text;
        clattn_status st = clattn_ocl_build_set(cl, family, head_dim, s->dtype, mods, set, 0);
        if (st != CLATTN_OK) {
            clattn_ocl_release_set(set);
            free(set->user);
            free(set);
            return st;
        }
        set->variant = family;
        set->head_dim = head_dim;
        clattn_log_append(cl->owner, "%s kernels at head_dim %u (%s) with the caller's%s%s%s%s%s%s",
                          family->name, (unsigned)s->head_dim, clattn_ocl_dtype_name(s->dtype),
                          mods & CLATTN_MOD_SCORE ? " score function" : "",
                          mods & CLATTN_MOD_MASK ? " mask function" : "",
                          mods & CLATTN_MOD_BIAS ? " bias" : "",
                          mods & CLATTN_MOD_BOOL ? " bool mask" : "", reason ? ": " : "",
                          reason ? reason : "");
        if (kept + 1 > USER_SETS_MAX) { /* the least recent goes */
            kernel_set **last = &cl->kernels.user;
            while ((*last)->next)
                last = &(*last)->next;
            clattn_ocl_release_set(*last);
            free((*last)->user);
            free(*last);
            *last = NULL;
        }
    }
    set->next = cl->kernels.user;
    cl->kernels.user = set;
    *out = set;
    return CLATTN_OK;
}

clattn_status clattn_ocl_generic_kernels_of(struct clattn_cl_state *cl, const clattn_shape *s,
                                            unsigned mods, kernel_set **out)
{
    if (mods & CLATTN_MOD_USER)
        return user_kernels(cl, NULL, NULL, s, mods, out);
    return clattn_ocl_generic_kernels(cl, s->dtype, mods, out);
}

clattn_status clattn_ocl_kernels_of(struct clattn_cl_state *cl, clattn_op op,
                                    const clattn_shape *s, kernel_set **out)
{
    const char *reason = NULL;
    const clattn_ocl_variant *v = clattn_ocl_variant_for(cl, op, s, &reason);
    const unsigned mods = clattn_op_modifiers(s, op);
    if (mods & CLATTN_MOD_USER)
        return user_kernels(cl, v, reason, s, mods, out);
    return clattn_ocl_kernels_for(cl, v, reason, s->head_dim, s->dtype, mods, out);
}
