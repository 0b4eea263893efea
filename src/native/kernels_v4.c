/* The native hot loops compiled for x86-64-v4 (flags: CMakeLists.txt). */
#define NATIVE_LEVEL v4
#define NATIVE_NAME "x86-64-v4"
#include "kernels.c"
