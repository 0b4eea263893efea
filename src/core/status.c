/* Errors and their messages, status and backend names, the version and
 * the options' defaults. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Large enough for a typical build log; longer ones are cut. */
static _Thread_local char last_error[16384];

clattn_status clattn_fail(clattn_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

void clattn_fail_append(const char *text)
{
    size_t used = strlen(last_error);
    if (used + 1 < sizeof last_error)
        snprintf(last_error + used, sizeof last_error - used, "\n%s", text);
}

void clattn_clear_error(void) { last_error[0] = '\0'; }

const char *clattn_last_error(void) { return last_error; }

const char *clattn_version(void) { return CLATTN_VERSION; }

const char *clattn_status_string(clattn_status status)
{
    switch (status) {
#define NAME(s) \
    case s:     \
        return #s;
        NAME(CLATTN_OK)
        NAME(CLATTN_ERROR_NULL_POINTER)
        NAME(CLATTN_ERROR_ZERO_SIZE)
        NAME(CLATTN_ERROR_HEADS_NOT_DIVISIBLE)
        NAME(CLATTN_ERROR_HEAD_DIM_TOO_LARGE)
        NAME(CLATTN_ERROR_CAUSAL_SEQ_MISMATCH)
        NAME(CLATTN_ERROR_INVALID_SCALE)
        NAME(CLATTN_ERROR_SIZE_OVERFLOW)
        NAME(CLATTN_ERROR_TOO_LARGE_FOR_DEVICE)
        NAME(CLATTN_ERROR_INVALID_OPTION)
        NAME(CLATTN_ERROR_UNKNOWN_VARIANT)
        NAME(CLATTN_ERROR_DEVICE_NOT_FOUND)
        NAME(CLATTN_ERROR_NO_PLATFORM)
        NAME(CLATTN_ERROR_BUILD_FAILED)
        NAME(CLATTN_ERROR_WORK_GROUP_TOO_LARGE)
        NAME(CLATTN_ERROR_OPENCL)
        NAME(CLATTN_ERROR_OUT_OF_MEMORY)
        NAME(CLATTN_ERROR_WRONG_BACKEND)
        NAME(CLATTN_ERROR_INVALID_BUFFER)
        NAME(CLATTN_ERROR_UNSUPPORTED_SHAPE)
        NAME(CLATTN_ERROR_INVALID_DTYPE)
        NAME(CLATTN_ERROR_INVALID_SEQLENS)
        NAME(CLATTN_ERROR_INVALID_MODIFIER)
        NAME(CLATTN_ERROR_IO)
#undef NAME
    }
    return "CLATTN_ERROR_UNKNOWN_STATUS";
}

const char *clattn_backend_name(clattn_backend backend)
{
    switch (backend) {
    case CLATTN_BACKEND_AUTO:
        return "auto";
    case CLATTN_BACKEND_OPENCL_GPU:
        return "opencl-gpu";
    case CLATTN_BACKEND_OPENCL_CPU:
        return "opencl-cpu";
    case CLATTN_BACKEND_NATIVE:
        return "native";
    }
    return "unknown";
}

clattn_options clattn_options_default(void)
{
    clattn_options o;
    memset(&o, 0, sizeof o);
    o.backend = CLATTN_BACKEND_AUTO;
    return o;
}
