/* The native hot loops' building blocks, for kernels.c alone (compiled
 * once per x86-64 level, so this header is too): the vector types of the
 * level, the two products, exp2, 16-bit conversions, row loads and stores,
 * and the 8 x 8 transposes. */
#ifndef CLATTN_NATIVE_SIMD_H
#define CLATTN_NATIVE_SIMD_H

#if defined(__GNUC__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

INLINE size_t row_index(const clattn_shape *s, size_t b, size_t pos, size_t head)
{
    return (b * s->q_seq + pos) * s->num_heads + head;
}

/* Element-wise work on a tile row (masks, softmax, exp) is written on
 * vectors of the level's own width, HW floats, KEY_BLOCK / HW of them a
 * row (`EACH_PART`), not left to the loop vectoriser, whose choices differ
 * between compiler versions; and GCC lowers comparisons of vectors wider
 * than the hardware's to scalar code.
 * Masks are comparison results (lanes 0 or -1); HSELECT takes a's lanes
 * where the mask is set, else b's; HSPLAT broadcasts a scalar. */
#if defined(__AVX512F__)
#define HW 16
#elif defined(__AVX__)
#define HW 8
#else
#define HW 4
#endif
typedef float hvec __attribute__((vector_size(HW * sizeof(float))));
typedef int32_t hivec __attribute__((vector_size(HW * sizeof(int32_t))));
typedef uint32_t huvec __attribute__((vector_size(HW * sizeof(uint32_t))));
typedef float hvec_u __attribute__((vector_size(HW * sizeof(float)), aligned(4), may_alias));
typedef uint32_t huvec_u
    __attribute__((vector_size(HW * sizeof(uint32_t)), aligned(4), may_alias));
#define hload(p) (*(const hvec_u *)(p))
#define hstore(p, v) (*(hvec_u *)(p) = (v))
#define huload(p) (*(const huvec_u *)(p))
#define HSELECT(mask, a, b) \
    ((hvec)(((hivec)(mask) & (hivec)(a)) | (~(hivec)(mask) & (hivec)(b))))
#define HSPLAT(x) ((hvec){0} + (x))
#define HMIN0(x) HSELECT((x) > 0.0f, HSPLAT(0.0f), (x)) /* min(x, 0), NaN kept */
/* HMAX(a, b): a where a > b, else b (b where either is NaN), one
 * instruction on x86 (GCC makes three of HSELECT's form); HMIN alike. */
#if defined(__AVX512F__)
#define HMAX(a, b) ((hvec)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define HMIN(a, b) ((hvec)_mm512_min_ps((__m512)(a), (__m512)(b)))
#elif defined(__AVX__)
#define HMAX(a, b) ((hvec)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define HMIN(a, b) ((hvec)_mm256_min_ps((__m256)(a), (__m256)(b)))
#elif defined(__SSE__)
#define HMAX(a, b) ((hvec)_mm_max_ps((__m128)(a), (__m128)(b)))
#define HMIN(a, b) ((hvec)_mm_min_ps((__m128)(a), (__m128)(b)))
#else
#define HMAX(a, b) HSELECT((a) > (b), (a), (b))
#define HMIN(a, b) HSELECT((a) < (b), (a), (b))
#endif
#define EACH_PART(h) for (int h = 0; h < KEY_BLOCK; h += HW)

/* The two products everything below is made of. Both keep one side
 * transposed, so that a tile's KEY_BLOCK keys (or QUERY_BLOCK query rows)
 * lie along one row of floats, and broadcast single elements of plain rows
 * against it, one hardware vector of the row at a time: no horizontal sums,
 * and eight independent accumulators to keep both FMA pipes busy (8 + 1 of
 * the 16 registers AVX2 and SSE have, of AVX-512's 32). */
typedef float tile_row[KEY_BLOCK];
/* A tile row is PARTS hardware vectors; the products below keep
 * DOT_ROWS x PARTS (and ACC_DIMS x PARTS) accumulators, so that one
 * broadcast element serves every part: 16 of AVX-512's 32 registers (8 rows
 * of 2 parts), 8 of AVX2's and SSE's 16 (2 rows of 4 parts, 1 of 8).
 * PAD_ROWS: what chunks of rows are padded to. */
enum { ACCUMULATORS = HW == 16 ? 16 : 8, PARTS = KEY_BLOCK / HW,
       DOT_ROWS = ACCUMULATORS / PARTS < 1 ? 1 : ACCUMULATORS / PARTS, ACC_DIMS = DOT_ROWS,
       PAD_ROWS = 8 };

/* IN_REGISTER(v): v is held in a register from here on. On AVX2 (16
 * registers, 8 of them accumulators) GCC otherwise folds the loads of a
 * tile row's parts into every FMA that uses them, loading each part once
 * per row: 10 loads for 8 FMAs, more than two load ports give two FMA
 * units. AVX-512 code keeps them in registers by itself. */
#if HW == 8 && defined(__GNUC__)
#define IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define IN_REGISTER(v) ((void)0)
#endif

/* lane_index[j] = j: the key of a tile row's lane. */
static const uint32_t lane_index[KEY_BLOCK] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
    16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

/* 2^t, lane by lane: t = n + f with n the nearest integer (the 1.5 * 2^23
 * trick) and f in [-1/2, 1/2]; 2^f by a degree-6 polynomial (fitted to
 * 2^f's relative error on that range by reweighted least squares: 1.9e-9,
 * within 1.6 ulp as float32 arithmetic evaluates it), times 2^n made in
 * the exponent bits. t is clamped to [-127, 127]; below -64 it gives 0, far
 * below anything the sums can see (the weights here are at most 1, and one
 * of each row's is 1), and never a subnormal weight: subnormal operands
 * make x86 FMAs take microcode assists, and ALiBi's far keys give many
 * weights in that range.
 * Scores go to the units of t with their scale in one product (scale *
 * log2(e)): about 15 operations a lane where exp() by Cody-Waite reduction
 * by ln 2 took about 22.
 *
 * AVX-512 has the rounding (vrndscaleps) and the scaling by 2^n
 * (vscalefps) as instructions: 11 operations a lane. Bit for bit the same:
 * n nearest-even either way, p * 2^n rounded once either way, and below
 * -64 the zero comes from the scaling's zero mask in one and a select in
 * the other; NaN (unordered, so not masked) stays NaN. The instructions
 * take fewer operations a lane than the bits form. */
#define LOG2E 1.44269504088896341f
INLINE hvec exp2_poly(hvec f)
{
    hvec p = HSPLAT(1.534581097e-4f);
    p = p * f + 1.339993207e-3f;
    p = p * f + 9.618489072e-3f;
    p = p * f + 5.550328642e-2f;
    p = p * f + 2.402264625e-1f;
    p = p * f + 6.931471825e-1f;
    return p * f + 1.0f;
}

#if defined(__AVX512F__)
INLINE hvec exp2v(hvec t)
{
    const __m512 x = _mm512_min_ps(_mm512_set1_ps(127.0f), (__m512)t); /* NaN stays NaN */
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 live = _mm512_cmp_ps_mask((__m512)t, _mm512_set1_ps(-64.0f), _CMP_NLT_UQ);
    return (hvec)_mm512_maskz_scalef_ps(live, (__m512)exp2_poly((hvec)x - (hvec)n), n);
}
#else
INLINE hvec exp2v(hvec t)
{
    const hivec dead = t < -64.0f; /* not NaN */
    t = HMIN(HSPLAT(127.0f), HMAX(HSPLAT(-127.0f), t)); /* NaN stays NaN */
    const hvec n = (t + 12582912.0f) - 12582912.0f;
    const hivec bits = (__builtin_convertvector(n, hivec) + 127) << 23;
    return HSELECT(dead, HSPLAT(0.0f), exp2_poly(t - n) * (hvec)bits);
}
#endif

static const float zero_row[CLATTN_MAX_HEAD_DIM];

/* n elements of a 16-bit dtype to float32 and back, as clattn_to_f32 and
 * clattn_from_f32 do. float16 by F16C's conversions where the level has
 * them, F16_LANES at a time (the tail through a padded block), since GCC
 * leaves a loop of _Float16 casts scalar, one vcvtph2ps per element.
 * Rounding to nearest even, NaNs quiet, as clattn_from_f32 does. */
#if defined(__F16C__)
#if defined(__AVX512F__)
#define F16_LANES 16
#define F16_WIDEN(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define F16_NARROW(p, x)                                                                        \
    _mm256_storeu_si256((__m256i *)(p),                                                     \
                        _mm512_cvtps_ph((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define F16_LOADF(p) _mm512_loadu_ps(p)
#define F16_STOREF(p, x) _mm512_storeu_ps((p), (x))
#else
#define F16_LANES 8
#define F16_WIDEN(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define F16_NARROW(p, x)                                                                        \
    _mm_storeu_si128((__m128i *)(p),                                                        \
                     _mm256_cvtps_ph((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define F16_LOADF(p) _mm256_loadu_ps(p)
#define F16_STOREF(p, x) _mm256_storeu_ps((p), (x))
#endif
#endif

INLINE void widen_n(clattn_dtype dtype, const void *src, float *dst, size_t n)
{
    if (dtype == CLATTN_DTYPE_BF16) { /* a vector loop at this level */
        const uint16_t *h = src;
        for (size_t i = 0; i < n; ++i)
            dst[i] = clattn_bf16_to_f32(h[i]);
        return;
    }
#if defined(__F16C__)
    if (dtype == CLATTN_DTYPE_F16) {
        const uint16_t *h = src;
        size_t i = 0;
        for (; i + F16_LANES <= n; i += F16_LANES)
            F16_STOREF(dst + i, F16_WIDEN(h + i));
        if (i < n) {
            uint16_t in[F16_LANES] = {0};
            float out[F16_LANES];
            memcpy(in, h + i, (n - i) * sizeof in[0]);
            F16_STOREF(out, F16_WIDEN(in));
            memcpy(dst + i, out, (n - i) * sizeof out[0]);
        }
        return;
    }
#endif
    clattn_to_f32(dtype, src, dst, n);
}

/* n of the bias's elements of query row pos (below q_seq) of head `head`
 * of element b, from key t0 on, as float32: in the bias itself, or
 * widened into buf (a 16-bit bias) by this level's conversions. */
INLINE const float *native_bias_row(const native_call *c, size_t b, size_t head, size_t pos,
                                    uint32_t t0, uint32_t n, float *buf)
{
    const clattn_shape *s = c->s;
    const size_t at = clattn_bias_index(s, b, head, pos, t0);
    if (s->bias_dtype == CLATTN_DTYPE_F32)
        return (const float *)s->bias + at;
    widen_n(s->bias_dtype, (const uint16_t *)s->bias + at, buf, n);
    return buf;
}

INLINE void narrow_n(clattn_dtype dtype, const float *src, void *dst, size_t n)
{
    if (dtype == CLATTN_DTYPE_BF16) {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; ++i)
            h[i] = clattn_f32_to_bf16(src[i]);
        return;
    }
#if defined(__F16C__)
    if (dtype == CLATTN_DTYPE_F16) {
        uint16_t *h = dst;
        size_t i = 0;
        for (; i + F16_LANES <= n; i += F16_LANES)
            F16_NARROW(h + i, F16_LOADF(src + i));
        if (i < n) {
            float in[F16_LANES] = {0};
            uint16_t out[F16_LANES];
            memcpy(in, src + i, (n - i) * sizeof in[0]);
            F16_NARROW(out, F16_LOADF(in));
            memcpy(h + i, out, (n - i) * sizeof out[0]);
        }
        return;
    }
#endif
    clattn_from_f32(dtype, src, dst, n);
}

/* n elements of tensor t (float32, or the call's 16-bit dtype) from
 * element `at` on, as float32: t's own where it is float32, else widened
 * into buf. */
INLINE const float *in_row(const native_call *c, const void *t, size_t at, size_t n, float *buf)
{
    if (c->s->dtype == CLATTN_DTYPE_F32)
        return (const float *)t + at;
    widen_n(c->s->dtype, (const uint16_t *)t + at, buf, n);
    return buf;
}

/* The n floats x to tensor t (float32 or the call's 16-bit dtype) from
 * element `at` on, added to what is there where `add` (s->accumulate), a
 * 16-bit sum in float32 and rounded once; x is overwritten. */
INLINE void out_row(const native_call *c, void *t, size_t at, float *x, size_t n, int add)
{
    if (c->s->dtype == CLATTN_DTYPE_F32) {
        float *out = (float *)t + at;
        for (size_t i = 0; i < n; ++i)
            out[i] = add ? out[i] + x[i] : x[i];
        return;
    }
    uint16_t *out = (uint16_t *)t + at;
    if (add) {
        _Alignas(64) float old[CLATTN_MAX_HEAD_DIM];
        widen_n(c->s->dtype, out, old, n);
        for (size_t i = 0; i < n; ++i)
            x[i] = old[i] + x[i];
    }
    narrow_n(c->s->dtype, x, out, n);
}

/* Tiles (KEY_BLOCK rows along a row of floats) to rows and back, 8 x 8
 * blocks at a time by AVX's shuffles where the level has them: an element
 * at a time, a tile's transposes (the query block's in, O's or dQ's out)
 * had taken 9% of the forward's time on one thread of the development
 * machine. transpose8 writes column k of the 8 x 8 block r (row i: r[i])
 * to out + k * stride. */
#if defined(__AVX__)
INLINE void transpose8(const __m256 r[8], float *out, size_t stride)
{
    const __m256 a0 = _mm256_unpacklo_ps(r[0], r[1]), a1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 a2 = _mm256_unpacklo_ps(r[2], r[3]), a3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 a4 = _mm256_unpacklo_ps(r[4], r[5]), a5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 a6 = _mm256_unpacklo_ps(r[6], r[7]), a7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xee);
    const __m256 b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xee);
    const __m256 b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xee);
    const __m256 b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xee);
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(b0, b4, 0x20));
    _mm256_storeu_ps(out + stride, _mm256_permute2f128_ps(b1, b5, 0x20));
    _mm256_storeu_ps(out + 2 * stride, _mm256_permute2f128_ps(b2, b6, 0x20));
    _mm256_storeu_ps(out + 3 * stride, _mm256_permute2f128_ps(b3, b7, 0x20));
    _mm256_storeu_ps(out + 4 * stride, _mm256_permute2f128_ps(b0, b4, 0x31));
    _mm256_storeu_ps(out + 5 * stride, _mm256_permute2f128_ps(b1, b5, 0x31));
    _mm256_storeu_ps(out + 6 * stride, _mm256_permute2f128_ps(b2, b6, 0x31));
    _mm256_storeu_ps(out + 7 * stride, _mm256_permute2f128_ps(b3, b7, 0x31));
}
#endif

/* t[d][j] = rows[j][d] for the KEY_BLOCK rows of a tile. */
INLINE void transpose_in(const float *const *rows, size_t D, tile_row *t)
{
#if defined(__AVX__)
    size_t d0 = 0;
    for (; d0 + 8 <= D; d0 += 8)
        for (int j0 = 0; j0 < KEY_BLOCK; j0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i)
                r[i] = _mm256_loadu_ps(rows[j0 + i] + d0);
            transpose8(r, t[d0] + j0, KEY_BLOCK);
        }
    for (; d0 < D; ++d0)
        for (int j = 0; j < KEY_BLOCK; ++j)
            t[d0][j] = rows[j][d0];
#else
    native_transpose(rows, D, t[0]);
#endif
}

/* rows[j * D + d] = t[d][j] for the KEY_BLOCK columns of a tile. */
INLINE void tile_to_rows(const tile_row *t, size_t D, float *rows)
{
    size_t d0 = 0;
#if defined(__AVX__)
    for (; d0 + 8 <= D; d0 += 8)
        for (int j0 = 0; j0 < KEY_BLOCK; j0 += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i)
                r[i] = _mm256_loadu_ps(t[d0 + i] + j0);
            transpose8(r, rows + j0 * D + d0, D);
        }
#endif
    for (int j = 0; j < KEY_BLOCK; ++j)
        for (size_t d = d0; d < D; ++d)
            rows[j * D + d] = t[d][j];
}

#endif
