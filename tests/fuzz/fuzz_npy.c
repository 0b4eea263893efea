/* libFuzzer target: the .npy parser on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>

#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    npy_array a;
    char err[256];
    if (npy_parse(data, size, &a, err, sizeof err) == 0) {
        /* A parsed array's elements are all there to read, in the one
         * array its descr says (float32, 16-bit, int32 or bool). */
        volatile float sink = 0.0f;
        if ((a.data != NULL) + (a.bits != NULL) + (a.ints != NULL) + (a.bools != NULL) != 1)
            __builtin_trap();
        for (size_t i = 0; i < a.count; ++i)
            sink += a.data   ? a.data[i]
                    : a.bits ? (float)a.bits[i]
                    : a.ints ? (float)a.ints[i]
                             : (float)a.bools[i];
        (void)sink;
        npy_free(&a);
    }
    return 0;
}
