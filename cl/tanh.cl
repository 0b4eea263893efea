/*
 * The tanh of softcap, ahead of every program's text (src/opencl/build.c),
 * before the caller's functions, which may call it as clattn_tanh
 * (docs/programmable.md).
 */

/* tanh(y) as native takes it. Where |y| < 1/4, its odd series to y^9
 * (relative error below float32's own rounding there), so that a large cap
 * tends to no cap: 1 - e would leave only an absolute error of a few ulps
 * of 1, a relative one that grows as y shrinks. Else sign(y) (1 - e) /
 * (1 + e) from e = 2^(-2 |y| log2 e): one exp2 and one division in place
 * of tanh's longer sequence. NaN stays NaN, and +-inf gives +-1.
 * tanh_of_e takes e made by the caller's exp2 (mma's ex2.approx). */
#define TWO_LOG2E (2.0f * 1.44269504088896341f)
#define TANH_SERIES_BELOW 0.25f
inline float tanh_series(float y)
{
    const float y2 = y * y;
    return y * (1.0f + y2 * (-1.0f / 3.0f +
                             y2 * (2.0f / 15.0f + y2 * (-17.0f / 315.0f + y2 * (62.0f / 2835.0f)))));
}

inline float tanh_of_e(float x, float e)
{
    const float a = (1.0f - e) / (1.0f + e);
    return x < 0.0f ? -a : a;
}

inline float softcap_tanh(float y)
{
    return fabs(y) < TANH_SERIES_BELOW ? tanh_series(y) : tanh_of_e(y, exp2(-fabs(y) * TWO_LOG2E));
}

/* clattn_tanh, what the caller's functions call: softcap_tanh, or in
 * mma's 16-bit kernels on the GPU one tanh.approx.f32, as its built-in
 * softcap (relative error below 2^-10.9, under half a bf16 ulp). */
#if defined(MMA_TILE) && defined(DTYPE) && DTYPE != 0 && !defined(MMA_EMULATE)
inline float clattn_tanh(float y)
{
    float t;
    __asm__("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(y));
    return t;
}
#else
inline float clattn_tanh(float y) { return softcap_tanh(y); }
#endif
