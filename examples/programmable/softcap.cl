/* Gemma 2's logit soft-capping as a function: p[0] * tanh(s / p[0]) with
 * the cap in p[0] (--score-params, one float), and its derivative
 * 1 - tanh^2. s times the cap's reciprocal, not s / p[0]: a kernel
 * computes the reciprocal once, not a division a score. The built-in --softcap computes the same. clattn_tanh is
 * clattn's tanh (docs/programmable.md): the built-in's where the hardware
 * has one (mma's 16-bit kernels on an NVIDIA GPU), else its series and
 * exponential, in the C form the command line compiles for native too. */
float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    return p[0] * clattn_tanh(s * (1.0f / p[0]));
}

float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    const float t = clattn_tanh(s * (1.0f / p[0]));
    return 1.0f - t * t;
}
