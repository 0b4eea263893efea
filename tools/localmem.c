/* How much local memory a work-group of an OpenCL GPU can really have:
 * CL_DEVICE_LOCAL_MEM_SIZE beside a kernel launched with a __local
 * argument of each size in turn, each launch's status and whether its
 * values came back. tools/device_run.sh's `localmem` stage builds and runs
 * it:  cc -O1 -o localmem tools/localmem.c -lOpenCL && ./localmem */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>

static const char *source =
    "__kernel void fill(__global float *out, __local float *buf, uint n)\n"
    "{\n"
    "    const uint l = get_local_id(0), s = get_local_size(0);\n"
    "    for (uint i = l; i < n; i += s)\n"
    "        buf[i] = (float)i;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    out[get_global_id(0)] = buf[(l * 7919u) % n];\n"
    "}\n";

enum { LANES = 256 };

/* One launch with `bytes` of local memory: 0 where every value came back. */
static int try_size(cl_command_queue queue, cl_kernel kernel, cl_mem out, size_t bytes)
{
    const cl_uint n = (cl_uint)(bytes / sizeof(float));
    const size_t global = LANES, local = LANES;
    float got[LANES];
    cl_int set = clSetKernelArg(kernel, 0, sizeof out, &out);
    set |= clSetKernelArg(kernel, 1, bytes, NULL);
    set |= clSetKernelArg(kernel, 2, sizeof n, &n);
    const cl_int run =
        set ? set : clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, &local, 0, NULL, NULL);
    const cl_int done = clFinish(queue);
    const cl_int read =
        clEnqueueReadBuffer(queue, out, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL);
    int right = !set && !run && !done && !read;
    for (cl_uint i = 0; right && i < LANES; ++i)
        right = got[i] == (float)((i * 7919u) % n);
    printf("  %7zu bytes: set %d, enqueue %d, finish %d, read %d: %s\n", bytes, set, run, done,
           read, right ? "values right" : "no result");
    return !right;
}

int main(void)
{
    static const size_t sizes[] = {32768, 45056, 48128, 49152, 65536, 101376, 166912, 232448};
    cl_platform_id platforms[8];
    cl_uint np = 0;
    if (clGetPlatformIDs(8, platforms, &np) != CL_SUCCESS || np == 0) {
        fprintf(stderr, "localmem: no OpenCL platform\n");
        return 1;
    }
    int gpus = 0;
    for (cl_uint p = 0; p < np && p < 8; ++p) {
        cl_device_id device;
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_GPU, 1, &device, &nd) != CL_SUCCESS ||
            nd == 0)
            continue;
        char name[256] = "";
        cl_ulong said = 0;
        clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof name, name, NULL);
        clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof said, &said, NULL);
        printf("%s: CL_DEVICE_LOCAL_MEM_SIZE %llu\n", name, (unsigned long long)said);
        cl_int err;
        cl_context context = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
        cl_command_queue queue = err ? NULL : clCreateCommandQueue(context, device, 0, &err);
        cl_program program = err ? NULL : clCreateProgramWithSource(context, 1, &source, NULL, &err);
        if (!err)
            err = clBuildProgram(program, 1, &device, "", NULL, NULL);
        cl_kernel kernel = err ? NULL : clCreateKernel(program, "fill", &err);
        cl_mem out = err ? NULL
                         : clCreateBuffer(context, CL_MEM_READ_WRITE, LANES * sizeof(float), NULL,
                                          &err);
        if (err)
            printf("  setting up: OpenCL error %d\n", err);
        for (size_t i = 0; !err && i < sizeof sizes / sizeof *sizes; ++i)
            try_size(queue, kernel, out, sizes[i]);
        if (out)
            clReleaseMemObject(out);
        if (kernel)
            clReleaseKernel(kernel);
        if (program)
            clReleaseProgram(program);
        if (queue)
            clReleaseCommandQueue(queue);
        if (context)
            clReleaseContext(context);
        ++gpus;
    }
    if (!gpus)
        printf("no OpenCL GPU\n");
    return 0;
}
