/* OpenCL devices: enumerating platforms and devices, picking one for a
 * selector, and making a context's state on it. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "variant.h"

/* One OpenCL device as enumerated: platforms in order, then their devices. */
typedef struct cl_entry {
    cl_platform_id platform;
    cl_device_id device;
    unsigned platform_index, device_index;
    int is_cpu;
    char platform_name[128];
    char name[128];
} cl_entry;

static void query_string(cl_int (*get)(void *, cl_uint, size_t, void *, size_t *), void *obj,
                         cl_uint what, char *out, size_t size)
{
    if (get(obj, what, size, out, NULL) != CL_SUCCESS)
        snprintf(out, size, "?");
    out[size - 1] = '\0';
}

static cl_int get_platform_info(void *p, cl_uint what, size_t n, void *out, size_t *ret)
{
    return clGetPlatformInfo((cl_platform_id)p, what, n, out, ret);
}

static cl_int get_device_info(void *d, cl_uint what, size_t n, void *out, size_t *ret)
{
    return clGetDeviceInfo((cl_device_id)d, what, n, out, ret);
}

/* Lists every device of every platform into a new array (free() it).
 * A runtime without platforms yields CLATTN_ERROR_NO_PLATFORM. */
/* Every device of every platform. A platform whose devices cannot be
 * listed (an error other than having none) is skipped, so that one broken
 * driver hides no other's devices; *fault gets the first such error (0 if
 * none), so that a selector matching nothing can say a driver failed. */
static clattn_status enumerate(cl_entry **out, size_t *count, cl_int *fault)
{
    *out = NULL;
    *count = 0;
    *fault = CL_SUCCESS;
    cl_uint np = 0;
    cl_int err = clGetPlatformIDs(0, NULL, &np);
    if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && np == 0))
        return clattn_fail(CLATTN_ERROR_NO_PLATFORM,
                           "no OpenCL platform: the ICD loader found no driver (%d)", err);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clGetPlatformIDs");
    cl_platform_id *plats = calloc(np, sizeof *plats);
    if (!plats)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    clattn_status st = CLATTN_OK;
    cl_entry *list = NULL;
    size_t n = 0;
    err = clGetPlatformIDs(np, plats, NULL);
    if (err != CL_SUCCESS) {
        st = clattn_ocl_fail(err, "clGetPlatformIDs");
        goto done;
    }
    for (cl_uint p = 0; p < np; ++p) {
        cl_uint nd = 0;
        /* A platform with no devices answers CL_DEVICE_NOT_FOUND. */
        err = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (err != CL_SUCCESS && err != CL_DEVICE_NOT_FOUND && *fault == CL_SUCCESS)
            *fault = err;
        if (err != CL_SUCCESS || !nd)
            continue;
        cl_device_id *devs = calloc(nd, sizeof *devs);
        cl_entry *grown = realloc(list, (n + nd) * sizeof *list);
        if (!devs || !grown) {
            free(devs);
            if (grown)
                list = grown;
            st = clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
            goto done;
        }
        list = grown;
        if ((err = clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL)) != CL_SUCCESS) {
            if (*fault == CL_SUCCESS)
                *fault = err;
            nd = 0;
        }
        for (cl_uint d = 0; d < nd; ++d) {
            cl_entry *e = &list[n++];
            cl_device_type type = 0;
            e->platform = plats[p];
            e->device = devs[d];
            e->platform_index = p;
            e->device_index = d;
            clGetDeviceInfo(devs[d], CL_DEVICE_TYPE, sizeof type, &type, NULL);
            e->is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
            query_string(get_platform_info, plats[p], CL_PLATFORM_NAME, e->platform_name,
                         sizeof e->platform_name);
            query_string(get_device_info, devs[d], CL_DEVICE_NAME, e->name, sizeof e->name);
        }
        free(devs);
    }
done:
    free(plats);
    if (st != CLATTN_OK) {
        free(list);
        return st;
    }
    *out = list;
    *count = n;
    return CLATTN_OK;
}

clattn_status clattn_list_devices(clattn_device_info *devices, size_t capacity, size_t *count)
{
    if (!count || (!devices && capacity))
        return clattn_fail(CLATTN_ERROR_NULL_POINTER, "%s is NULL", count ? "devices" : "count");
    cl_entry *list;
    size_t n;
    cl_int fault;
    clattn_status st = enumerate(&list, &n, &fault);
    if (st == CLATTN_ERROR_NO_PLATFORM)
        n = 0;
    else if (st != CLATTN_OK)
        return st;
    for (size_t i = 0; i < n && i < capacity; ++i) {
        clattn_device_info *d = &devices[i];
        d->backend = list[i].is_cpu ? CLATTN_BACKEND_OPENCL_CPU : CLATTN_BACKEND_OPENCL_GPU;
        d->platform_index = (int)list[i].platform_index;
        d->device_index = (int)list[i].device_index;
        snprintf(d->platform, sizeof d->platform, "%s", list[i].platform_name);
        snprintf(d->name, sizeof d->name, "%s", list[i].name);
    }
    if (n < capacity) {
        clattn_device_info *d = &devices[n];
        d->backend = CLATTN_BACKEND_NATIVE;
        d->platform_index = d->device_index = -1;
        snprintf(d->platform, sizeof d->platform, "clattn");
        snprintf(d->name, sizeof d->name, "native C");
    }
    *count = n + 1;
    free(list);
    clattn_clear_error();
    return CLATTN_OK;
}

static void release_state(struct clattn_cl_state *cl)
{
    if (!cl)
        return;
    for (int i = 0; i < CLATTN_R_COUNT; ++i)
        if (cl->host_copy.buffer[i])
            clReleaseMemObject(cl->host_copy.buffer[i]);
    if (cl->ds.buffer)
        clReleaseMemObject(cl->ds.buffer);
    if (cl->ds.last_read)
        clReleaseEvent(cl->ds.last_read);
    if (cl->parts.buffer)
        clReleaseMemObject(cl->parts.buffer);
    if (cl->parts.last_read)
        clReleaseEvent(cl->parts.last_read);
    if (cl->mask_map.buffer)
        clReleaseMemObject(cl->mask_map.buffer);
    free(cl->mask_map.text);
    for (int i = 0; i < PACKED_QUEUES; ++i)
        if (cl->packed_queues[i])
            clReleaseCommandQueue(cl->packed_queues[i]);
    for (int t = 0; t < 3; ++t)
        if (cl->kernels.merge[t])
            clReleaseKernel(cl->kernels.merge[t]);
    for (int m = 0; m < CLATTN_MODS; ++m)
        for (int t = 0; t < 3; ++t) {
            clattn_ocl_release_set(&cl->kernels.any_head_dim[m][t]);
            for (int d = 0; d <= CLATTN_MAX_HEAD_DIM; ++d)
                for (kernel_set *set = cl->kernels.per_head_dim[m][t][d], *next; set;
                     set = next) {
                    next = set->next;
                    clattn_ocl_release_set(set);
                    free(set);
                }
        }
    for (kernel_set *set = cl->kernels.user, *next; set; set = next) {
        next = set->next;
        clattn_ocl_release_set(set);
        free(set->user);
        free(set);
    }
    if (cl->own_queue && cl->queue)
        clReleaseCommandQueue(cl->queue);
    if (cl->own_context && cl->context)
        clReleaseContext(cl->context);
    free(cl);
}

static void opencl_destroy(clattn_context *ctx)
{
    release_state(ctx->cl);
    ctx->cl = NULL;
}

/* The most work-items of a one-dimensional work-group: the device's
 * limit and its first dimension's. */
static clattn_status work_group_limit(cl_device_id device, size_t *out)
{
    size_t wg = 0, sizes[16] = {0}, bytes = 0;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    if (err == CL_SUCCESS)
        err = clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof sizes, sizes, &bytes);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clGetDeviceInfo");
    if (bytes >= sizeof(size_t) && sizes[0] < wg)
        wg = sizes[0];
    if (wg < 1)
        return clattn_fail(CLATTN_ERROR_WORK_GROUP_TOO_LARGE,
                           "the device reports work-groups of at most %zu work-items", wg);
    *out = wg;
    return CLATTN_OK;
}

/* CLATTN_DEVICE_LIMITS=WG[,LOCAL_BYTES] lowers the device's work-group
 * and local-memory limits, so that tests reach the paths of small devices
 * on a large one. It never raises them. */
static clattn_status test_limits(struct clattn_cl_state *cl)
{
    const char *text = getenv("CLATTN_DEVICE_LIMITS");
    if (!text || !*text)
        return CLATTN_OK;
    unsigned long wg = 0, local = 0;
    char end;
    const int n = sscanf(text, "%lu,%lu%c", &wg, &local, &end);
    if ((n != 1 && n != 2) || wg < 1 || (n == 2 && local < 1024))
        return clattn_fail(CLATTN_ERROR_INVALID_OPTION,
                           "CLATTN_DEVICE_LIMITS='%s': want WG[,LOCAL_BYTES], WG at least 1 "
                           "and LOCAL_BYTES at least 1024",
                           text);
    if (wg < cl->limits.max_wg)
        cl->limits.max_wg = wg;
    if (n == 2 && local < cl->limits.local_mem)
        cl->limits.local_mem = local;
    return CLATTN_OK;
}

static const clattn_backend_ops opencl_ops = {clattn_ocl_run, opencl_destroy, 1, NULL,
                                              clattn_ocl_grad_bias_host,
                                              clattn_ocl_grad_params_host};

/* Makes ctx an OpenCL context on device with a named variant. */
static clattn_status init_variant(clattn_context *ctx, const clattn_ocl_variant *variant,
                                  cl_context context, cl_device_id device, cl_command_queue queue,
                                  int strict_limits)
{
    struct clattn_cl_state *cl = calloc(1, sizeof *cl);
    if (!cl)
        return clattn_fail(CLATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    cl->owner = ctx;
    cl->device = device;
    cl_int err = CL_SUCCESS;
    clattn_status st = CLATTN_OK;
    if (context) {
        cl->context = context;
    } else {
        cl->context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
        cl->own_context = 1;
        if (err != CL_SUCCESS) {
            cl->context = NULL;
            st = clattn_ocl_fail(err, "clCreateContext");
            goto fail;
        }
    }
    if (queue) {
        cl->queue = queue;
    } else {
        cl->queue = clCreateCommandQueue(cl->context, device, 0, &err);
        cl->own_queue = 1;
        if (err != CL_SUCCESS) {
            cl->queue = NULL;
            st = clattn_ocl_fail(err, "clCreateCommandQueue");
            goto fail;
        }
    }
    cl_device_type type = 0;
    if ((err = clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof cl->limits.max_alloc,
                               &cl->limits.max_alloc, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof cl->limits.global_mem,
                               &cl->limits.global_mem, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof cl->limits.local_mem,
                               &cl->limits.local_mem, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT,
                               sizeof cl->limits.float_width,
                               &cl->limits.float_width, NULL)) ||
        (err = clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS,
                               sizeof cl->limits.compute_units, &cl->limits.compute_units,
                               NULL))) {
        st = clattn_ocl_fail(err, "clGetDeviceInfo");
        goto fail;
    }
    /* Mesa's llvmpipe stops each work-item after 65535 loop iterations in
     * all (gallivm's loop limiter, LP_MAX_TGSI_LOOP_ITERATIONS) and keeps
     * what it wrote so far: launch.c refuses calls that could reach it. */
    char name[128];
    query_string(get_device_info, device, CL_DEVICE_NAME, name, sizeof name);
    cl->limits.loop_cap = strstr(name, "llvmpipe") ? 65535ul : 0ul;
    if ((st = work_group_limit(device, &cl->limits.max_wg)) != CLATTN_OK ||
        (st = test_limits(cl)) != CLATTN_OK)
        goto fail;
    const char *local_probe = getenv("CLATTN_LOCAL_PROBE");
    cl->local_probe = local_probe && !strcmp(local_probe, "1");
    if (variant->runs_on && !variant->runs_on(device)) {
        st = clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT, "%s", variant->why_not);
        goto fail;
    }
    /* Some shapes follow how the device runs a work-group's items: PoCL runs
     * them as a loop; GPUs, and CPU drivers that map work-items to SIMD
     * lanes (Mesa's llvmpipe), side by side with registers of their own. */
    char platform_name[128];
    cl_platform_id platform = NULL;
    clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    query_string(get_platform_info, platform, CL_PLATFORM_NAME, platform_name,
                 sizeof platform_name);
    const int pocl = strstr(platform_name, "Portable Computing Language") != NULL;
    const int items_loop = (type & CL_DEVICE_TYPE_CPU) && pocl;
    /* PoCL caches what it compiles, keyed by source and options, and asked
     * for a program's binary compiles each of its kernels once more, for
     * any work-group size: clattn's cache is left off there unless asked. */
    const char *cache_pocl = getenv("CLATTN_CACHE_POCL");
    const int pocl_cached = cache_pocl && !strcmp(cache_pocl, "1");
    if (cache_pocl && !pocl_cached && strcmp(cache_pocl, "0") != 0) {
        st = clattn_fail(CLATTN_ERROR_INVALID_OPTION, "CLATTN_CACHE_POCL='%s': want 0 or 1",
                         cache_pocl);
        goto fail;
    }
    cl->program_cache = !pocl || pocl_cached;
    if ((st = clattn_ocl_tuning_init(cl, device, items_loop)) != CLATTN_OK)
        goto fail;
    /* `clattn tune`'s winners for this device, keyed as docs/tuning.md says. */
    char driver[128];
    query_string(get_device_info, device, CL_DRIVER_VERSION, driver, sizeof driver);
    if (clattn_ocl_tuning_key(platform_name, name, driver, cl->tuning_key,
                              sizeof cl->tuning_key))
        clattn_ocl_tuning_file(cl, ctx, cl->tuning_key);
    /* Each program is built once per context, when first needed, except
     * one now, so that a device that cannot compile the variant is never
     * chosen: the generic set (any head_dim) for the generic variant, or the
     * variant's for head_dim 64. */
    cl->variant = variant->per_head_dim ? variant : NULL;
    if (!cl->variant) {
        if ((st = clattn_ocl_build_set(cl, variant, 0, CLATTN_DTYPE_F32, 0,
                                       &cl->kernels.any_head_dim[0][0],
                                       strict_limits)) != CLATTN_OK)
            goto fail;
        cl->kernels.any_built[0][0] = 1;
    }
    kernel_set *probe = NULL;
    if (cl->variant &&
        (st = clattn_ocl_kernels_for(cl, cl->variant, NULL, 64, CLATTN_DTYPE_F32, 0, &probe)) !=
            CLATTN_OK)
        goto fail;

    ctx->backend =
        (type & CL_DEVICE_TYPE_CPU) ? CLATTN_BACKEND_OPENCL_CPU : CLATTN_BACKEND_OPENCL_GPU;
    snprintf(ctx->device, sizeof ctx->device, "%s: %s / %s", clattn_backend_name(ctx->backend),
             platform_name, name);
    snprintf(ctx->variant, sizeof ctx->variant, "%s", variant->name);
    ctx->ops = &opencl_ops;
    ctx->cl = cl;
    return CLATTN_OK;
fail:
    release_state(cl);
    return st;
}

clattn_status clattn_ocl_init_on_device(clattn_context *ctx, const char *variant,
                                        cl_context context, cl_device_id device,
                                        cl_command_queue queue, int strict_limits)
{
    if (variant) {
        const clattn_ocl_variant *v = clattn_ocl_find_variant(variant);
        if (!v)
            return clattn_fail(CLATTN_ERROR_UNKNOWN_VARIANT, "no OpenCL variant '%s'", variant);
        return init_variant(ctx, v, context, device, queue, strict_limits);
    }
    /* The device's default: the first variant listed for its type that it
     * builds and runs; each one refused is noted in the log. */
    cl_device_type type = 0;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    if (err != CL_SUCCESS)
        return clattn_ocl_fail(err, "clGetDeviceInfo");
    const clattn_backend kind =
        (type & CL_DEVICE_TYPE_CPU) ? CLATTN_BACKEND_OPENCL_CPU : CLATTN_BACKEND_OPENCL_GPU;
    clattn_status st = CLATTN_ERROR_UNKNOWN_VARIANT;
    for (size_t i = 0; (variant = clattn_variant_name(kind, i)) != NULL; ++i) {
        const clattn_ocl_variant *v = clattn_ocl_find_variant(variant);
        if (!v || (v->runs_on && !v->runs_on(device)))
            continue;
        st = init_variant(ctx, v, context, device, queue, strict_limits);
        if (st == CLATTN_OK) {
            /* Each call then runs the default's choice for it (choice.c). */
            ctx->cl->choose = ctx->cl->variant != NULL;
            break;
        }
        if (st == CLATTN_ERROR_OUT_OF_MEMORY)
            break;
        clattn_log_append(ctx, "auto: variant %s skipped: %s: %s", variant,
                          clattn_status_string(st), clattn_last_error());
    }
    return st;
}

static int matches(const clattn_cl_pick *pick, const cl_entry *e)
{
    switch (pick->kind) {
    case CLATTN_PICK_GPU:
        return !e->is_cpu;
    case CLATTN_PICK_CPU:
        return e->is_cpu;
    case CLATTN_PICK_INDEX:
        return e->platform_index == pick->platform && e->device_index == pick->device;
    case CLATTN_PICK_NAME: {
        size_t n = strlen(pick->name);
        for (const char *h = e->name; *h; ++h) {
            size_t i = 0;
            while (i < n && h[i] &&
                   tolower((unsigned char)h[i]) == tolower((unsigned char)pick->name[i]))
                ++i;
            if (i == n)
                return 1;
        }
        return 0;
    }
    }
    return 0;
}

static const char *pick_text(const clattn_cl_pick *pick, char *buf, size_t size)
{
    switch (pick->kind) {
    case CLATTN_PICK_GPU:
        return "OpenCL GPU";
    case CLATTN_PICK_CPU:
        return "OpenCL CPU device";
    case CLATTN_PICK_INDEX:
        snprintf(buf, size, "OpenCL device %u:%u", pick->platform, pick->device);
        return buf;
    case CLATTN_PICK_NAME:
        snprintf(buf, size, "OpenCL device named like '%s'", pick->name);
        return buf;
    }
    return "?";
}

clattn_status clattn_opencl_init(clattn_context *ctx, const clattn_options *opts,
                                 const clattn_cl_pick *pick, int all_candidates)
{
    cl_entry *list;
    size_t n;
    char buf[192];
    cl_int fault;
    clattn_status st = enumerate(&list, &n, &fault);
    if (st != CLATTN_OK)
        return st;
    st = CLATTN_ERROR_DEVICE_NOT_FOUND;
    size_t i;
    for (i = 0; i < n; ++i) {
        if (!matches(pick, &list[i]))
            continue;
        st = clattn_ocl_init_on_device(ctx, opts->variant, NULL, list[i].device, NULL,
                                       all_candidates);
        if (st == CLATTN_OK)
            break;
        clattn_log_append(ctx, "%u:%u %s / %s: %s: %s", list[i].platform_index,
                          list[i].device_index, list[i].platform_name, list[i].name,
                          clattn_status_string(st), clattn_last_error());
        if (!all_candidates)
            break;
    }
    if (st == CLATTN_OK)
        snprintf(ctx->device + strlen(ctx->device), sizeof ctx->device - strlen(ctx->device),
                 " (%u:%u)", list[i].platform_index, list[i].device_index);
    free(list);
    if (st == CLATTN_ERROR_DEVICE_NOT_FOUND && fault != CL_SUCCESS)
        return clattn_fail(CLATTN_ERROR_OPENCL,
                           "no %s among the OpenCL devices listed: a platform's devices could "
                           "not be listed: clGetDeviceIDs: %s (%d)",
                           pick_text(pick, buf, sizeof buf), clattn_ocl_error_name(fault), fault);
    if (st == CLATTN_ERROR_DEVICE_NOT_FOUND)
        return clattn_fail(st, "no %s among the OpenCL devices (see `clattn devices`)",
                           pick_text(pick, buf, sizeof buf));
    return st;
}
