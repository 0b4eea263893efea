/*
 * Whether Hopper's warpgroup products (wgmma, PTX target sm_90a) can be
 * reached from OpenCL C on NVIDIA's OpenCL, whose compiler emits PTX for
 * sm_90 and whose assembler refuses wgmma there.
 *
 * The route tried: the kernel carries each sm_90a instruction as inline PTX
 * inside a comment that starts with the marker below, so that the source
 * builds for sm_90 with the operands (registers) filled in by the
 * compiler; the program's binary (its PTX) is then patched - target
 * sm_90a, markers removed, by src/sm90a.c as the library does - and built
 * again with clCreateProgramWithBinary. The kernel computes one m64n8k16 product
 * (bf16 operands, float32 accumulators; A from registers in mma.sync's
 * m16n8k16 layout, warp w holding rows 16w..16w+15; B from local memory
 * through a matrix descriptor, no swizzle: two 8 x 8 core matrices along
 * k, 128 bytes each, the second `lbo` bytes past the first) and checks it
 * against the same product in C on small integers, which every step holds
 * exactly.
 *
 * ctest runs it as sm90a_probe.opencl-gpu (build/tests/sm90a_probe alone):
 * exit 0 when the product is exact, 1 when it is wrong or did not run, 77
 * (skipped) without an NVIDIA GPU of compute capability 9.
 */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sm90a.h" /* the library's own patch of the PTX (src/sm90a.c) */

#define MARK CLATTN_SM90A_MARK

static const char kernel_source[] =
    "inline uint bf16_bits(float x) { return as_uint(x) >> 16; } /* exact for small ints */\n"
    "__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void\n"
    "product(__global const float *a, __global const float *b, __global float *d, uint lbo)\n"
    "{\n"
    "    __local ushort bt[8 * 16] __attribute__((aligned(128)));\n"
    "    const uint lid = get_local_id(0), w = lid >> 5, g = (lid & 31u) >> 2, t = lid & 3u;\n"
    "    /* B^T: 8 rows (n) of 16 (k), as two core matrices along k */\n"
    "    bt[(lid & 15u) / 8u * 64u + lid / 16u * 8u + (lid & 7u)] = bf16_bits(b[lid]);\n"
    "    /* local memory written by plain stores, read next by the tensor cores */\n"
    "    __asm__ __volatile__(\"" MARK "fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    uint r[4];\n"
    "    for (uint i = 0; i < 4; ++i) {\n"
    "        const uint row = 16u * w + g + (i & 1u) * 8u, col = 2u * t + (i >> 1) * 8u;\n"
    "        r[i] = bf16_bits(a[row * 16u + col]) | bf16_bits(a[row * 16u + col + 1u]) << 16;\n"
    "    }\n"
    "    const ulong at = (uint)(ulong)bt;\n"
    "    const ulong desc = (at & 0x3ffffu) >> 4 | (ulong)(lbo >> 4) << 16 | (ulong)(lbo >> 4) << 32;\n"
    "    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};\n"
    "    __asm__ __volatile__(\"" MARK "wgmma.fence.sync.aligned;\" ::: \"memory\");\n"
    "    __asm__ __volatile__(\"" MARK "{ .reg .pred p; setp.ne.b32 p, %8, 0; \"\n"
    "                         \"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 \"\n"
    "                         \"{%0, %1, %2, %3}, {%4, %5, %6, %7}, %9, p, 1, 1, 0; }\"\n"
    "                         : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "                         : \"r\"(r[0]), \"r\"(r[1]), \"r\"(r[2]), \"r\"(r[3]), \"r\"(0u),\n"
    "                           \"l\"(desc) : \"memory\");\n"
    "    __asm__ __volatile__(\"" MARK "wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n"
    "    __asm__ __volatile__(\"" MARK "wgmma.wait_group.sync.aligned 0;\"\n"
    "                         : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3]) :: \"memory\");\n"
    "    for (uint i = 0; i < 4; ++i)\n"
    "        d[(16u * w + g + (i >> 1) * 8u) * 8u + 2u * t + (i & 1u)] = c[i];\n"
    "}\n";

/* The first NVIDIA GPU of compute capability 9 or more, or 0. */
static cl_device_id hopper(void)
{
    cl_platform_id platforms[16];
    cl_uint n = 0;
    if (clGetPlatformIDs(16, platforms, &n) != CL_SUCCESS)
        return 0;
    for (cl_uint i = 0; i < n && i < 16; ++i) {
        char name[256] = "";
        cl_device_id dev;
        cl_uint major = 0;
        clGetPlatformInfo(platforms[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, "NVIDIA") &&
            clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL) == CL_SUCCESS &&
            clGetDeviceInfo(dev, 0x4000 /* CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV */,
                            sizeof major, &major, NULL) == CL_SUCCESS &&
            major >= 9)
            return dev;
    }
    return 0;
}

/* Builds the kernel for sm_90a as above into *out; prints why not. */
static int build_sm90a(cl_context ctx, cl_device_id dev, cl_program *out)
{
    const char *src = kernel_source;
    cl_int err;
    cl_program first = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    if (err != CL_SUCCESS || clBuildProgram(first, 1, &dev, "-cl-std=CL1.2", NULL, NULL)) {
        printf("the source did not build for sm_90\n");
        if (err == CL_SUCCESS)
            clReleaseProgram(first);
        return 0;
    }
    size_t size = 0;
    char *ptx = NULL, *opened = NULL;
    int ok = clGetProgramInfo(first, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) ==
                 CL_SUCCESS &&
             size && (ptx = calloc(size + 1, 1)) != NULL &&
             clGetProgramInfo(first, CL_PROGRAM_BINARIES, sizeof ptx, &ptx, NULL) == CL_SUCCESS;
    clReleaseProgram(first);
    const int made = ok ? clattn_sm90a_ptx(ptx, &opened) : CLATTN_SM90A_OK;
    if (made == CLATTN_SM90A_NOT_SM90)
        printf("the PTX names no '.target sm_90,'\n");
    ok = ok && made == CLATTN_SM90A_OK;
    if (ok) {
        const size_t len = strlen(opened) + 1;
        const unsigned char *bin = (const unsigned char *)opened;
        cl_int status;
        *out = clCreateProgramWithBinary(ctx, 1, &dev, &len, &bin, &status, &err);
        ok = err == CL_SUCCESS;
        if (ok && clBuildProgram(*out, 1, &dev, "", NULL, NULL) != CL_SUCCESS) {
            char log[4096] = "";
            clGetProgramBuildInfo(*out, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
            printf("the sm_90a PTX did not build: %s\n", log);
            clReleaseProgram(*out);
            ok = 0;
        }
    }
    free(ptx);
    free(opened);
    return ok;
}

int main(void)
{
    cl_device_id dev = hopper();
    if (!dev) {
        printf("skipped: no NVIDIA GPU of compute capability 9 here\n");
        return 77;
    }
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    if (err != CL_SUCCESS)
        return 1;
    cl_command_queue queue = clCreateCommandQueue(ctx, dev, 0, &err);
    cl_program prog = NULL;
    int ok = err == CL_SUCCESS && build_sm90a(ctx, dev, &prog);
    float a[64 * 16], b[16 * 8], d[64 * 8], want[64 * 8];
    srand(1);
    for (int i = 0; i < 64 * 16; ++i)
        a[i] = (float)(rand() % 9 - 4);
    for (int i = 0; i < 16 * 8; ++i)
        b[i] = (float)(rand() % 9 - 4); /* b[n * 16 + k]: B^T by rows */
    for (int m = 0; m < 64; ++m)
        for (int n = 0; n < 8; ++n) {
            float s = 0.0f;
            for (int k = 0; k < 16; ++k)
                s += a[m * 16 + k] * b[n * 16 + k];
            want[m * 8 + n] = s;
        }
    int wrong = -1;
    if (ok) {
        cl_kernel kernel = clCreateKernel(prog, "product", &err);
        cl_mem ma = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof a, a, NULL);
        cl_mem mb = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof b, b, NULL);
        cl_mem md = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof d, NULL, NULL);
        const cl_uint lbo = 128; /* bytes from the k 0..7 core matrix to k 8..15's */
        const size_t global = 128, local = 128;
        if (err == CL_SUCCESS && ma && mb && md &&
            clSetKernelArg(kernel, 0, sizeof ma, &ma) == CL_SUCCESS &&
            clSetKernelArg(kernel, 1, sizeof mb, &mb) == CL_SUCCESS &&
            clSetKernelArg(kernel, 2, sizeof md, &md) == CL_SUCCESS &&
            clSetKernelArg(kernel, 3, sizeof lbo, &lbo) == CL_SUCCESS &&
            clEnqueueNDRangeKernel(queue, kernel, 1, NULL, &global, &local, 0, NULL, NULL) ==
                CL_SUCCESS &&
            clEnqueueReadBuffer(queue, md, CL_TRUE, 0, sizeof d, d, 0, NULL, NULL) ==
                CL_SUCCESS) {
            wrong = 0;
            for (int i = 0; i < 64 * 8; ++i)
                wrong += d[i] != want[i];
        }
        if (md)
            clReleaseMemObject(md);
        if (mb)
            clReleaseMemObject(mb);
        if (ma)
            clReleaseMemObject(ma);
        if (err == CL_SUCCESS)
            clReleaseKernel(kernel);
        clReleaseProgram(prog);
    }
    if (queue)
        clReleaseCommandQueue(queue);
    clReleaseContext(ctx);
    if (wrong < 0)
        printf("wgmma m64n8k16 from OpenCL C: did not run\n");
    else
        printf("wgmma m64n8k16 from OpenCL C (PTX patched to sm_90a): %d of 512 outputs differ "
               "from C's\n",
               wrong);
    return wrong == 0 ? 0 : 1;
}
