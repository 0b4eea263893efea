/* Gemma 2's logit soft-capping as a function: p[0] * tanh(s / p[0]) with
 * the cap in p[0] (--score-params, one float), and its derivative
 * 1 - tanh^2. The built-in --softcap computes the same. */
float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    return p[0] * tanh(s / p[0]);
}

float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    const float t = tanh(s / p[0]);
    return 1.0f - t * t;
}
