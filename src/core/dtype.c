/* 16-bit elements to float32 and back. */
#include <math.h>
#include <string.h>

#include "internal.h"

/* 16-bit elements to float32 and back (round to nearest even; NaN stays a
 * quiet NaN, overflow becomes infinity), in portable C. */
static float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu, x;
    if (exp == 0x1fu)
        x = sign | 0x7f800000u | (mant << 13);
    else if (exp)
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    else if (!mant)
        x = sign;
    else { /* subnormal: mant * 2^-24 */
        uint32_t e = 113;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            --e;
        }
        x = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, mant = x & 0x7fffffu;
    const int exp = (int)((x >> 23) & 0xffu);
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
    const int e = exp - 112; /* the binary16 exponent field */
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    uint32_t m = mant, shift = 13;
    if (e <= 0) { /* subnormal (or zero) in binary16 */
        if (e < -10)
            return (uint16_t)sign;
        m |= 0x800000u;
        shift = (uint32_t)(14 - e);
    }
    uint32_t h = (e > 0 ? (uint32_t)e << 10 : 0u) | (m >> shift);
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u)))
        ++h; /* a carry rounds up into the exponent, as it should */
    return (uint16_t)(sign | h);
}

void clattn_to_f32(clattn_dtype dtype, const void *src, float *dst, size_t n)
{
    if (dtype == CLATTN_DTYPE_F32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    if (dtype != CLATTN_DTYPE_F16 && dtype != CLATTN_DTYPE_BF16)
        return;
    const uint16_t *h = src;
    for (size_t i = 0; i < n; ++i)
        dst[i] = dtype == CLATTN_DTYPE_BF16 ? clattn_bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}

void clattn_bias_values(const clattn_shape *s, size_t i, size_t n, float *out)
{
    const size_t bytes = clattn_bias_bytes(s);
    clattn_to_f32(s->bias_dtype, (const unsigned char *)s->bias + i * bytes, out, n);
}

void clattn_from_f32(clattn_dtype dtype, const float *src, void *dst, size_t n)
{
    if (dtype == CLATTN_DTYPE_F32) {
        memmove(dst, src, n * sizeof(float));
        return;
    }
    if (dtype != CLATTN_DTYPE_F16 && dtype != CLATTN_DTYPE_BF16)
        return;
    uint16_t *h = dst;
    for (size_t i = 0; i < n; ++i)
        h[i] = dtype == CLATTN_DTYPE_BF16 ? clattn_f32_to_bf16(src[i]) : f32_to_f16(src[i]);
}
