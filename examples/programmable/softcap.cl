/* Gemma 2's logit soft-capping as a function: p[0] * tanh(s / p[0]) with
 * the cap in p[0] (--score-params, one float), and its derivative
 * 1 - tanh^2. The built-in --softcap computes the same. tanh here is taken
 * as the built-in takes it, which costs less than tanh(): its odd series
 * where |y| < 1/4 (exact to float32 there, so that a large cap tends to no
 * cap), else sign(y) (1 - e) / (1 + e) with e = exp(-2 |y|). Helpers take
 * a prefix of their own (ex_): clattn's own names must stay free. */
static float ex_tanh(float y)
{
    const float y2 = y * y;
    if (fabs(y) < 0.25f)
        return y * (1.0f + y2 * (-1.0f / 3.0f + y2 * (2.0f / 15.0f + y2 * (-17.0f / 315.0f +
                                                                          y2 * (62.0f / 2835.0f)))));
    const float e = exp(-2.0f * fabs(y));
    const float t = (1.0f - e) / (1.0f + e);
    return y < 0.0f ? -t : t;
}

float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    return p[0] * ex_tanh(s / p[0]);
}

float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    const float t = ex_tanh(s / p[0]);
    return 1.0f - t * t;
}
