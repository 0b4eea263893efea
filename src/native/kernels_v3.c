/* The native hot loops compiled for x86-64-v3 (flags: CMakeLists.txt). */
#define NATIVE_LEVEL v3
#define NATIVE_NAME "x86-64-v3"
#include "kernels.c"
