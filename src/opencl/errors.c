/* OpenCL error codes: their names, and the status and message a failed
 * OpenCL call becomes. Below every other file of the backend. */
#include "opencl.h"

const char *clattn_ocl_error_name(cl_int err)
{
    switch (err) {
#define E(x)                                                                                       \
    case x:                                                                                        \
        return #x;
        E(CL_DEVICE_NOT_FOUND)
        E(CL_DEVICE_NOT_AVAILABLE)
        E(CL_COMPILER_NOT_AVAILABLE)
        E(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        E(CL_OUT_OF_RESOURCES)
        E(CL_OUT_OF_HOST_MEMORY)
        E(CL_BUILD_PROGRAM_FAILURE)
        E(CL_INVALID_VALUE)
        E(CL_INVALID_DEVICE)
        E(CL_INVALID_CONTEXT)
        E(CL_INVALID_COMMAND_QUEUE)
        E(CL_INVALID_MEM_OBJECT)
        E(CL_INVALID_BUILD_OPTIONS)
        E(CL_INVALID_PROGRAM_EXECUTABLE)
        E(CL_INVALID_KERNEL_ARGS)
        E(CL_INVALID_WORK_GROUP_SIZE)
        E(CL_INVALID_WORK_ITEM_SIZE)
        E(CL_INVALID_GLOBAL_WORK_SIZE)
        E(CL_INVALID_EVENT_WAIT_LIST)
        E(CL_INVALID_EVENT)
        E(CL_INVALID_BUFFER_SIZE)
        E(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
        E(CL_MISALIGNED_SUB_BUFFER_OFFSET)
#undef E
    case CL_PLATFORM_NOT_FOUND_KHR:
        return "CL_PLATFORM_NOT_FOUND_KHR";
    }
    return "an OpenCL error";
}

clattn_status clattn_ocl_fail(cl_int err, const char *what)
{
    /* A buffer past the device's largest allocation is the input's fault;
     * an allocation that fails within it (CL_MEM_OBJECT_ALLOCATION_FAILURE,
     * the device out of memory) is the device's. */
    if (err == CL_INVALID_BUFFER_SIZE)
        return clattn_fail(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE, "%s: %s (%d)", what,
                           clattn_ocl_error_name(err), err);
    return clattn_fail(CLATTN_ERROR_OPENCL, "%s: %s (%d)", what, clattn_ocl_error_name(err), err);
}
