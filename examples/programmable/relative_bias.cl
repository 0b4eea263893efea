/* A learned relative-position bias (T5's, unbucketed): query head h adds
 * p[h * 65 + d + 32] for the distance d = k - q clamped to [-32, 32]. The
 * parameters (--score-params, 65 floats a head) are the table. The
 * derivative in s is 1: the bias does not depend on s. */
float clattn_score(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    const int d = (int)k - (int)q;
    const int at = d < -32 ? 0 : d > 32 ? 64 : d + 32;
    return s + p[h * 65u + (uint)at];
}

float clattn_score_ds(float s, uint b, uint h, uint q, uint k, __global const float *p)
{
    return 1.0f;
}

/* For a learned table (clattn backward --d-score-params): the one entry
 * a pair reads, whose derivative is 1. */
uint clattn_score_dp(float s, uint b, uint h, uint q, uint k, __global const float *p,
                     uint *index, float *d)
{
    const int dist = (int)k - (int)q;
    index[0] = h * 65u + (uint)(dist < -32 ? 0 : dist > 32 ? 64 : dist + 32);
    d[0] = 1.0f;
    return 1u;
}
