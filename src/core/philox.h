/* Dropout's draws (docs/numerics.md, "Dropout"): Philox4x32-10 (Salmon et
 * al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the call's
 * key from the seed and offset, and the keep test of one (b, h, P, T).
 * cl/common.cl computes the same in OpenCL C. */
#ifndef CLATTN_PHILOX_H
#define CLATTN_PHILOX_H

#include <math.h>
#include <stdint.h>

static inline void clattn_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t a = (uint64_t)0xD2511F53u * c0, b = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(b >> 32) ^ c1 ^ k0, n2 = (uint32_t)(a >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)b;
        c3 = (uint32_t)a;
        c0 = n0;
        c2 = n2;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The dropout state of a call: the key of its draws and the threshold
 * they are kept from. */
typedef struct clattn_dropout {
    uint32_t key[2];
    uint32_t threshold; /* ceil(p * 2^8): an 8-bit draw u is kept iff u >= threshold */
    float gain;         /* 1 / (1 - p), as kept probabilities are scaled */
} clattn_dropout;

static inline clattn_dropout clattn_dropout_of(float p, uint64_t seed, uint64_t offset)
{
    clattn_dropout d;
    const uint32_t ctr[4] = {(uint32_t)offset, (uint32_t)(offset >> 32), 0u, 0u};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    clattn_philox(ctr, key, out);
    d.key[0] = out[0];
    d.key[1] = out[1];
    d.threshold = (uint32_t)ceil((double)p * 256.0); /* p < 1: at most 2^8 */
    d.gain = (float)(1.0 / (1.0 - (double)p));
    return d;
}

/* Whether (b, h, P, T) is kept: the draw is byte T mod 16 of Philox at the
 * counter (T / 16, P, h, b), byte T mod 4 of word (T mod 16) / 4, low byte
 * first, so sixteen consecutive keys share one block. */
static inline int clattn_dropout_keeps(const clattn_dropout *d, uint32_t b, uint32_t h,
                                       uint32_t P, uint32_t T)
{
    const uint32_t ctr[4] = {T >> 4, P, h, b};
    uint32_t out[4];
    clattn_philox(ctr, d->key, out);
    return ((out[(T & 15u) >> 2] >> (8u * (T & 3u))) & 0xFFu) >= d->threshold;
}

#endif /* CLATTN_PHILOX_H */
