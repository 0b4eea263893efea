/* A fault-injection shim for the tests, loaded by LD_PRELOAD in front of
 * the OpenCL ICD loader: it counts the OpenCL calls that clattn must
 * handle failing (creations, enqueues, arguments, waits, builds) and makes
 * the Nth of them fail, as a driver out of resources would. The test
 * finds faultcl_arm and faultcl_calls with dlsym. */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static long calls, fault_at;
/* FAULTCL_FAIL=NAME[:N] in the environment: fail the Nth call (default the
 * first) of the function NAME, for a whole program run (the CLI's tests). */
static const char *fail_name;
static long fail_nth, named_calls;

__attribute__((constructor)) static void faultcl_from_env(void)
{
    static char name[64];
    const char *env = getenv("FAULTCL_FAIL");
    if (!env || !*env)
        return;
    const size_t len = strcspn(env, ":");
    if (len >= sizeof name)
        return;
    memcpy(name, env, len);
    name[len] = '\0';
    fail_name = name;
    fail_nth = env[len] == ':' ? atol(env + len + 1) : 1;
}

/* Counts calls from 0 again and fails the nth (0: none). */
void faultcl_arm(long n);
void faultcl_arm(long n)
{
    calls = 0;
    fault_at = n;
}

/* The calls counted since the last faultcl_arm(). */
long faultcl_calls(void);
long faultcl_calls(void) { return calls; }

static int hit(const char *function)
{
    if (fail_name && !strcmp(function, fail_name) && ++named_calls == fail_nth)
        return 1;
    return ++calls == fault_at;
}

/* The real function, from the library after this one. */
#define REAL(name)                                                              \
    static __typeof__(&name) real;                                              \
    if (!real)                                                                  \
        *(void **)&real = dlsym(RTLD_NEXT, #name)

cl_mem clCreateBuffer(cl_context c, cl_mem_flags f, size_t size, void *host, cl_int *err)
{
    REAL(clCreateBuffer);
    if (hit(__func__)) {
        if (err)
            *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return NULL;
    }
    return real(c, f, size, host, err);
}

cl_kernel clCreateKernel(cl_program p, const char *name, cl_int *err)
{
    REAL(clCreateKernel);
    if (hit(__func__)) {
        if (err)
            *err = CL_OUT_OF_RESOURCES;
        return NULL;
    }
    return real(p, name, err);
}

cl_program clCreateProgramWithBinary(cl_context c, cl_uint n, const cl_device_id *d,
                                     const size_t *len, const unsigned char **bin,
                                     cl_int *status, cl_int *err)
{
    REAL(clCreateProgramWithBinary);
    if (hit(__func__)) {
        if (err)
            *err = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    return real(c, n, d, len, bin, status, err);
}

cl_program clCreateProgramWithSource(cl_context c, cl_uint n, const char **src,
                                     const size_t *len, cl_int *err)
{
    REAL(clCreateProgramWithSource);
    if (hit(__func__)) {
        if (err)
            *err = CL_OUT_OF_HOST_MEMORY;
        return NULL;
    }
    return real(c, n, src, len, err);
}

cl_int clBuildProgram(cl_program p, cl_uint n, const cl_device_id *d, const char *options,
                      void(CL_CALLBACK *notify)(cl_program, void *), void *data)
{
    REAL(clBuildProgram);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(p, n, d, options, notify, data);
}

cl_int clGetKernelWorkGroupInfo(cl_kernel k, cl_device_id d, cl_kernel_work_group_info what,
                                size_t size, void *value, size_t *ret)
{
    REAL(clGetKernelWorkGroupInfo);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(k, d, what, size, value, ret);
}

cl_int clSetKernelArg(cl_kernel k, cl_uint i, size_t size, const void *value)
{
    REAL(clSetKernelArg);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(k, i, size, value);
}

cl_int clEnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t *off,
                              const size_t *global, const size_t *local, cl_uint n,
                              const cl_event *wait, cl_event *ev)
{
    REAL(clEnqueueNDRangeKernel);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(q, k, dims, off, global, local, n, wait, ev);
}

cl_int clEnqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool block, size_t off,
                            size_t size, const void *p, cl_uint n, const cl_event *wait,
                            cl_event *ev)
{
    REAL(clEnqueueWriteBuffer);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(q, m, block, off, size, p, n, wait, ev);
}

cl_int clEnqueueReadBuffer(cl_command_queue q, cl_mem m, cl_bool block, size_t off, size_t size,
                           void *p, cl_uint n, const cl_event *wait, cl_event *ev)
{
    REAL(clEnqueueReadBuffer);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(q, m, block, off, size, p, n, wait, ev);
}

cl_int clEnqueueFillBuffer(cl_command_queue q, cl_mem m, const void *pattern, size_t psize,
                           size_t off, size_t size, cl_uint n, const cl_event *wait,
                           cl_event *ev)
{
    REAL(clEnqueueFillBuffer);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(q, m, pattern, psize, off, size, n, wait, ev);
}

cl_int clWaitForEvents(cl_uint n, const cl_event *evs)
{
    REAL(clWaitForEvents);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(n, evs);
}

cl_int clRetainProgram(cl_program p)
{
    REAL(clRetainProgram);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(p);
}

cl_int clRetainEvent(cl_event e)
{
    REAL(clRetainEvent);
    return hit(__func__) ? CL_OUT_OF_RESOURCES : real(e);
}

cl_int clGetMemObjectInfo(cl_mem m, cl_mem_info what, size_t size, void *value, size_t *ret)
{
    REAL(clGetMemObjectInfo);
    return hit(__func__) ? CL_INVALID_MEM_OBJECT : real(m, what, size, value, ret);
}
