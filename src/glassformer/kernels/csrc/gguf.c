/* Matrix products straight from GGUF blocks (llama.cpp's weight formats), fp32 activations.

   y[m, n] = sum_k x[m, k] * w[n, k], where row n of w is stored as the file stores it: K / V
   blocks of B bytes (V = 32 for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; 256 for the K-quants).
   glassformer.kernels.gguf_blocks documents the layouts. `decode` turns one block into its
   fp32 values with the arithmetic of the gguf package's reference decoder, operation for
   operation (so gguf_dequantize equals it bit for bit); the products sum in fp32, with
   AVX-512 where the compiler targets it. Rows are shared among OpenMP threads. The last
   section multiplies rows interleaved 16 at a time, exactly or with x rounded to 8 bits.

   Built by glassformer.kernels.gguf_kernels with the machine's C compiler (-O3 -march=native
   -fopenmp -ffp-contract=off), loaded with ctypes. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

static inline float half(const uint8_t *p) {
    _Float16 h;
    memcpy(&h, p, 2);
    return (float)h;
}

static inline uint32_t word(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* bytes per block, values per block */
static int block_bytes(int type) {
    switch (type) {
        case Q4_0: return 18;
        case Q4_1: return 20;
        case Q5_0: return 22;
        case Q5_1: return 24;
        case Q8_0: return 34;
        case Q4_K: return 144;
        case Q5_K: return 176;
        case Q6_K: return 210;
        default: return 0;
    }
}

static int block_values(int type) { return type >= Q4_K ? 256 : 32; }

/* the 32-value types whose blocks hold a min m (x = d q + m), and a fifth bit per value */
static inline int has_min(int type) { return type == Q4_1 || type == Q5_1; }
static inline int has_fifth(int type) { return type == Q5_0 || type == Q5_1; }

static int64_t row_bytes(int type, int64_t K) { return K / block_values(type) * block_bytes(type); }

/* Q4_K's and Q5_K's six-bit scale and min of sub-block j from the 12 packed bytes. */
static inline void scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* One block's values, as the reference decodes them. */
static void decode(int type, const uint8_t *b, float *out) {
    switch (type) {
        case Q8_0: {
            const float d = half(b);
            for (int i = 0; i < 32; i++) out[i] = (float)(int8_t)b[2 + i] * d;
            break;
        }
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
            const int min = has_min(type), five = has_fifth(type);
            const float d = half(b), m = min ? half(b + 2) : 0.0f;
            const uint32_t qh = five ? word(b + 2 + 2 * min) : 0;
            const uint8_t *qs = b + 2 + 2 * min + 4 * five;
            const int offset = min ? 0 : (five ? 16 : 8);
            for (int i = 0; i < 32; i++) {
                int q = (qs[i % 16] >> (4 * (i / 16))) & 15;
                q |= (int)((qh >> i) & 1) << 4;
                out[i] = min ? d * (float)q + m : d * (float)(q - offset);
            }
            break;
        }
        case Q4_K: case Q5_K: {
            const int five = type == Q5_K;
            const float d = half(b), dmin = half(b + 2);
            const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
            for (int t = 0; t < 8; t++) {
                int sc, mn;
                scale_min(b + 4, t, &sc, &mn);
                const float s = d * (float)sc, m = dmin * (float)mn;
                for (int i = 0; i < 32; i++) {
                    int q = (qs[32 * (t / 2) + i] >> (4 * (t % 2))) & 15;
                    if (five) q |= ((qh[i] >> t) & 1) << 4;
                    out[32 * t + i] = s * (float)q - m;
                }
            }
            break;
        }
        case Q6_K: {
            const float d = half(b + 208);
            const int8_t *sc = (const int8_t *)(b + 192);
            for (int h = 0; h < 2; h++)
                for (int t = 0; t < 4; t++)
                    for (int i = 0; i < 32; i++) {
                        const int lo = (b[64 * h + 32 * (t % 2) + i] >> (4 * (t / 2))) & 15;
                        const int hi = (b[128 + 32 * h + i] >> (2 * t)) & 3;
                        const int v = 128 * h + 32 * t + i;
                        out[v] = (d * (float)sc[v / 16]) * (float)((lo | hi << 4) - 32);
                    }
            break;
        }
    }
}

#ifdef __AVX512F__
#include <immintrin.h>
/* The sums with AVX-512: 16 lanes, the weights widened to int32 then fp32. A block's offset
   (Q4_0's -8, Q5_0's -16, Q4_1's and Q5_1's +m, the K-quants' mins) is taken out of the sum,
   sum_i (s q_i + c) x_i = s sum_i q_i x_i + c sum_i x_i, with the 32-value sums of x (sx)
   computed once per row of x. */

static inline __m512i widen(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* 16 values' fifth bits, bit `shift` of each of `bits`, as 0 or 16 */
static inline __m512i fifth(__m512i bits, int shift) {
    return _mm512_and_si512(_mm512_slli_epi32(_mm512_srl_epi32(bits, _mm_cvtsi32_si128(shift)), 4),
                            _mm512_set1_epi32(16));
}

/* q (two halves of 16 values, as fp32) times x, summed per lane: 16 partial sums of a block */
static inline __m512 times(__m512 q0, __m512 q1, const float *x) {
    return _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(x)));
}

static inline __m512 as_float(__m512i q) { return _mm512_cvtepi32_ps(q); }

/* A 4-bit value (the low four bits of each lane) to fp32 by table lookup, one instruction:
   `table` holds the 16 values, minus the format's offset where it has one. */
static inline __m512 nibble(__m512i v, __m512 table) { return _mm512_permutexvar_ps(v, table); }

/* A 5-bit value (0..31 in each lane) by two tables: values 0-15 and 16-31. */
static inline __m512 five_bits(__m512i v, __m512 low, __m512 high) {
    return _mm512_permutex2var_ps(low, v, high);
}

static inline __m512 table(int first) {
    return _mm512_setr_ps(first, first + 1, first + 2, first + 3, first + 4, first + 5, first + 6,
                          first + 7, first + 8, first + 9, first + 10, first + 11, first + 12,
                          first + 13, first + 14, first + 15);
}

#ifndef AHEAD
#define AHEAD 2048 /* bytes of the row prefetched ahead of the block in use */
#endif

/* Each kernel multiplies one weight row by R rows of x at once (R = 1 to 4, a constant where
   it is inlined): a block is decoded once for all of them. x's rows are K apart, their
   32-value sums (sx) K / 32 apart; out gets R sums. */
#define INLINE static inline __attribute__((always_inline))

INLINE void dot_small(int type, const uint8_t *b, const float *x, const float *sx, int64_t K,
                      const int R, float *out) {
    const int bytes = block_bytes(type), min = has_min(type);
    const int five = has_fifth(type), offset = min ? 0 : (five ? -16 : -8);
    const __m512i low = _mm512_set1_epi32(15);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 table_low = table(offset), table_high = table(offset + 16);
    __m512 acc[4];
    float offsets[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), offsets[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 32, b += bytes) {
        _mm_prefetch((const char *)b + AHEAD, _MM_HINT_T0);
        const __m512 d = _mm512_set1_ps(half(b));
        __m512 q0, q1;
        if (type == Q8_0) {
            q0 = as_float(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2))));
            q1 = as_float(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18))));
        } else if (five) {
            const __m512i v = widen(b + 6 + 2 * min);
            const uint32_t qh = word(b + 2 + 2 * min);
            const __m512i h0 = _mm512_srlv_epi32(_mm512_set1_epi32((int)qh), lanes);
            const __m512i h1 = _mm512_srlv_epi32(_mm512_set1_epi32((int)(qh >> 16)), lanes);
            q0 = five_bits(_mm512_or_si512(_mm512_and_si512(v, low), fifth(h0, 0)), table_low, table_high);
            q1 = five_bits(_mm512_or_si512(_mm512_srli_epi32(v, 4), fifth(h1, 0)), table_low, table_high);
        } else {
            const __m512i v = widen(b + 2 + 2 * min);
            q0 = nibble(v, table_low);
            q1 = nibble(_mm512_srli_epi32(v, 4), table_low);
        }
        const float m = min ? half(b + 2) : 0.0f;
        for (int r = 0; r < R; r++) {
            if (min) offsets[r] += m * sx[r * (K / 32) + k / 32];
            acc[r] = _mm512_fmadd_ps(d, times(q0, q1, x + r * K + k), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]) + offsets[r];
}

INLINE void dot_k4_or_5(const uint8_t *b, const float *x, const float *sx, int64_t K, int five,
                        const int R, float *out) {
    const __m512i low = _mm512_set1_epi32(15);
    const int64_t bytes = five ? 176 : 144;
    __m512 acc[4];
    float offsets[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps(), offsets[r] = 0.0f;
    const __m512 table_low = table(0), table_high = table(16);
    for (int64_t k = 0; k < K; k += 256, b += bytes) {
        _mm_prefetch((const char *)b + AHEAD, _MM_HINT_T0);
        _mm_prefetch((const char *)b + AHEAD + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)b + AHEAD + 128, _MM_HINT_T0);
        const float d = half(b), dmin = half(b + 2);
        const uint8_t *qs = b + (five ? 48 : 16);
        int sc[8], mn[8];
        for (int t = 0; t < 8; t++) scale_min(b + 4, t, &sc[t], &mn[t]);
        const __m512i h0 = five ? widen(b + 16) : _mm512_setzero_si512();
        const __m512i h1 = five ? widen(b + 32) : _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m512i v0 = widen(qs + 32 * j), v1 = widen(qs + 32 * j + 16);
            const __m512i e0 = _mm512_srli_epi32(v0, 4), f0 = _mm512_srli_epi32(v1, 4);
            __m512 a, c, e, f;
            if (five) {
                const __m512i a0 = _mm512_and_si512(v0, low), c0 = _mm512_and_si512(v1, low);
                a = five_bits(_mm512_or_si512(a0, fifth(h0, 2 * j)), table_low, table_high);
                c = five_bits(_mm512_or_si512(c0, fifth(h1, 2 * j)), table_low, table_high);
                e = five_bits(_mm512_or_si512(e0, fifth(h0, 2 * j + 1)), table_low, table_high);
                f = five_bits(_mm512_or_si512(f0, fifth(h1, 2 * j + 1)), table_low, table_high);
            } else {
                a = nibble(v0, table_low), c = nibble(v1, table_low);
                e = nibble(e0, table_low), f = nibble(f0, table_low);
            }
            const __m512 s0 = _mm512_set1_ps(d * (float)sc[2 * j]);
            const __m512 s1 = _mm512_set1_ps(d * (float)sc[2 * j + 1]);
            const float m0 = dmin * (float)mn[2 * j], m1 = dmin * (float)mn[2 * j + 1];
            for (int r = 0; r < R; r++) {
                const float *xs = x + r * K + k + 64 * j, *sums = sx + r * (K / 32) + k / 32;
                acc[r] = _mm512_fmadd_ps(s0, times(a, c, xs), acc[r]);
                acc[r] = _mm512_fmadd_ps(s1, times(e, f, xs + 32), acc[r]);
                offsets[r] -= m0 * sums[2 * j];
                offsets[r] -= m1 * sums[2 * j + 1];
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]) + offsets[r];
}

INLINE void dot_q6_k(const uint8_t *b, const float *x, int64_t K, const int R, float *out) {
    const __m512i low = _mm512_set1_epi32(15), two = _mm512_set1_epi32(3), mid = _mm512_set1_epi32(32);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 256, b += 210) {
        for (int line = 0; line < 4; line++) _mm_prefetch((const char *)b + AHEAD + 64 * line, _MM_HINT_T0);
        const float d = half(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int h = 0; h < 2; h++) {
            const __m512i g0 = widen(b + 128 + 32 * h), g1 = widen(b + 128 + 32 * h + 16);
            const __m512i l0 = widen(b + 64 * h), l1 = widen(b + 64 * h + 16);
            const __m512i l2 = widen(b + 64 * h + 32), l3 = widen(b + 64 * h + 48);
            for (int t = 0; t < 4; t++) {
                const __m512i a = t % 2 ? l2 : l0, c = t % 2 ? l3 : l1;
                const __m128i down = _mm_cvtsi32_si128(4 * (t / 2)), up = _mm_cvtsi32_si128(2 * t);
                for (int part = 0; part < 2; part++) {
                    const __m512i lo = _mm512_and_si512(_mm512_srl_epi32(part ? c : a, down), low);
                    const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srl_epi32(part ? g1 : g0, up), two), 4);
                    const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(lo, hi), mid));
                    const __m512 s = _mm512_set1_ps(d * (float)sc[8 * h + 2 * t + part]);
                    const int64_t at = k + 128 * h + 32 * t + 16 * part;
                    for (int r = 0; r < R; r++)
                        acc[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(v, _mm512_loadu_ps(x + r * K + at)), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

INLINE void dot_rows(int type, const uint8_t *row, const float *x, const float *sx, int64_t K,
                     const int R, float *out) {
    switch (type) {
        case Q4_K: dot_k4_or_5(row, x, sx, K, 0, R, out); break;
        case Q5_K: dot_k4_or_5(row, x, sx, K, 1, R, out); break;
        case Q6_K: dot_q6_k(row, x, K, R, out); break;
        default: dot_small(type, row, x, sx, K, R, out);
    }
}

/* R rows of x (1 to 4) against one weight row: out gets R sums. */
static void dot(int type, const uint8_t *row, const float *x, const float *sx, int64_t K, int R,
                float *out) {
    switch (R) {
        case 1: dot_rows(type, row, x, sx, K, 1, out); break;
        case 2: dot_rows(type, row, x, sx, K, 2, out); break;
        case 3: dot_rows(type, row, x, sx, K, 3, out); break;
        default: dot_rows(type, row, x, sx, K, 4, out);
    }
}
#else
/* Without AVX-512: each block decoded, then multiplied (the compiler vectorises both). */
static float dot_one(int type, const uint8_t *row, const float *x, int64_t K) {
    float w[256], acc[32] = {0};
    const int values = block_values(type), bytes = block_bytes(type);
    for (int64_t k = 0; k < K; k += values, row += bytes) {
        decode(type, row, w);
        for (int v = 0; v < values; v += 32)
            for (int i = 0; i < 32; i++) acc[i] += w[v + i] * x[k + v + i];
    }
    float s = 0.0f;
    for (int i = 0; i < 32; i++) s += acc[i];
    return s;
}

static void dot(int type, const uint8_t *row, const float *x, const float *sx, int64_t K, int R,
                float *out) {
    (void)sx;
    for (int r = 0; r < R; r++) out[r] = dot_one(type, row, x + r * K, K);
}
#endif

/* 1 for the types computed here, 0 for any other. */
int gguf_supported(int type) { return block_bytes(type) > 0; }

/* The part of stacked parts (part p has rows[p] rows) that row *n lies in; *n becomes the
   row's number within it. */
static int part_of(int64_t *n, const int64_t *rows) {
    int p = 0;
    while (*n >= rows[p]) *n -= rows[p++];
    return p;
}

/* Where row n of a weight of `parts` stacked row blocks lies: part p has rows[p] rows of
   type types[p] at blocks[p]. */
static const uint8_t *row_at(int64_t n, const int *types, const uint8_t *const *blocks,
                             const int64_t *rows, int64_t K, int *type) {
    const int p = part_of(&n, rows);
    *type = types[p];
    return blocks[p] + n * row_bytes(types[p], K);
}

/* x's n sums of 32 values (a block's offset or min multiplies them) */
static float *block_sums(const float *x, int64_t n) {
    float *sx = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int j = 0; j < 32; j++) s += x[32 * i + j];
        sx[i] = s;
    }
    return sx;
}

static void round_to_8_bits(const float *x, int64_t n, int8_t *q, float *d, int32_t *sums);

/* y (M, N) = x (M, K) times the transpose of the weight (N = the sum of rows); rounded: x
   rounded to 8 bits first (each block of 32 values becomes d q), as the interleaved rows'
   integer products see it. */
void gguf_matmul(int parts, const int *types, const uint8_t *const *blocks, const int64_t *rows,
                 const float *x, float *y, int64_t M, int64_t K, int rounded) {
    int64_t N = 0;
    for (int p = 0; p < parts; p++) N += rows[p];
    float *xr = NULL;
    if (rounded) {
        const int64_t n = M * (K / 32);
        int8_t *q = malloc((size_t)(M * K));
        float *d = malloc(sizeof(float) * (size_t)n);
        int32_t *sums = malloc(sizeof(int32_t) * (size_t)n);
        round_to_8_bits(x, n, q, d, sums);
        xr = malloc(sizeof(float) * (size_t)(M * K));
        for (int64_t i = 0; i < M * K; i++) xr[i] = d[i / 32] * (float)q[i];
        x = xr;
        free(q), free(d), free(sums);
    }
    float *sx = block_sums(x, M * (K / 32));
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        int type;
        const uint8_t *row = row_at(n, types, blocks, rows, K, &type);
        float out[4];
        for (int64_t m = 0; m < M; m += 4) {  /* up to four rows of x per decoded block */
            const int R = M - m < 4 ? (int)(M - m) : 4;
            dot(type, row, x + m * K, sx + m * (K / 32), K, R, out);
            for (int r = 0; r < R; r++) y[(m + r) * N + n] = out[r];
        }
    }
    free(sx), free(xr);
}

/* w (count, K) = rows first .. first + count - 1 of the weight, decoded as the reference
   decodes them. */
void gguf_dequantize(int parts, const int *types, const uint8_t *const *blocks,
                     const int64_t *rows, float *w, int64_t K, int64_t first, int64_t count) {
    (void)parts;  /* row_at finds the part */
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
        int type;
        const uint8_t *row = row_at(first + i, types, blocks, rows, K, &type);
        const int values = block_values(type), bytes = block_bytes(type);
        for (int64_t k = 0; k < K; k += values) decode(type, row + k / values * bytes, w + i * K + k);
    }
}

/* Attention for one query per head (a decoding step), fp32: out (B, H, Dv) = softmax(q k^T *
   scale over the allowed keys) v, for q (B, H, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv),
   each key/value head serving H / Hkv neighbouring query heads; allowed (B, Tk) bytes, 1 = may
   attend (NULL: every key). Keys not allowed are skipped, not read. */
void one_query_attention(const float *q, const float *k, const float *v, const uint8_t *allowed,
                         float *out, int64_t B, int64_t H, int64_t Hkv, int64_t Tk, int64_t Dh,
                         int64_t Dv, float scale) {
    const int64_t group = H / Hkv;
    #pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H, kv = b * Hkv + h / group;
        const float *qh = q + bh * Dh, *kh = k + kv * Tk * Dh, *vh = v + kv * Tk * Dv;
        const uint8_t *ok = allowed ? allowed + b * Tk : NULL;
        float *o = out + bh * Dv, *scores = malloc(sizeof(float) * (size_t)Tk);
        float top = -INFINITY, total = 0.0f;
        for (int64_t t = 0; t < Tk; t++) {
            if (ok && !ok[t]) continue;
            float s = 0.0f;
            for (int64_t d = 0; d < Dh; d++) s += qh[d] * kh[t * Dh + d];
            scores[t] = s * scale;
            if (scores[t] > top) top = scores[t];
        }
        for (int64_t d = 0; d < Dv; d++) o[d] = 0.0f;
        for (int64_t t = 0; t < Tk; t++) {
            if (ok && !ok[t]) continue;
            const float p = expf(scores[t] - top);
            total += p;
            for (int64_t d = 0; d < Dv; d++) o[d] += p * vh[t * Dv + d];
        }
        for (int64_t d = 0; d < Dv; d++) o[d] = total > 0.0f ? o[d] / total : 0.0f;
        free(scores);
    }
}

/* ---- rows interleaved sixteen at a time (a decoding step's products) --------------------

   For one row of x the blocks above are read one weight row at a time, and every block's
   values are turned to floats and summed across the vector: more work than reading them.
   glassformer.kernels.gguf_linear.interleave lays 16 rows' blocks side by side, each block
   of 32 columns as: the 16 rows' scales d (fp16), their mins m (Q4_1, Q5_1), their fifth bits
   (Q5_0, Q5_1: a 32-bit word each, regrouped: column 4m + n's bit at bit 8n + m), then the values' bytes (Q4, Q5: byte i
   holds column i and, high nibble, column i + 16; Q8_0: byte i column i), four bytes of each
   row at a time: bytes 4j..4j+3 of rows 0..15, for each j. A 512-bit vector of them holds 16
   rows (one per 32-bit lane), four columns each. Then:

   - exact (fp32): column c of the 16 rows is one shift (and, for Q4, a 16-entry table lookup)
     away, multiplied by x's value there: 16 sums at once, no reductions;
   - rounded (llama.cpp's way, not exact): x's block of 32 rounded to 8 bits (d = max|x| / 127,
     q = round(x / d)); AVX-512 VNNI's vpdpbusd multiplies the four unsigned weight bytes of
     each lane by four signed bytes of q and adds them, 64 products in one instruction.
     Q4_0's -8, Q5_0's -16 and Q8_0's signed values (stored + 128 for the unsigned operand)
     come out through the sum of q. */

enum { K4_SCALES = 64, K4_MINS = 192, K4_VALUES = 320, K4_BYTES = 2368 };
enum { K6_SCALES = 32, K6_LOW = 288, K6_HIGH = 2336, K6_BYTES = 3360 };

/* the bytes before an interleaved block's values: d, m, the fifth bits */
static inline int64_t values_at(int type) {
    return 32 + 32 * has_min(type) + 64 * has_fifth(type);
}

int interleaved_bytes(int type) {  /* of 16 rows' block of 32 columns; 0: not interleaved */
    switch (type) {
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: return (int)values_at(type) + 256;
        case Q8_0: return 32 + 512;
        case Q4_K: return K4_BYTES / 8;
        case Q6_K: return K6_BYTES / 8;
        default: return 0;
    }
}

/* Q6_K interleaved, the same bytes moved: per 16 rows and super-block (K6_BYTES), the rows' d
   (fp16), their 16 scales (int8, scale u of the 16 rows at K6_SCALES + 16 u), then their 128
   bytes of low nibbles (K6_LOW) and 64 bytes of high bit pairs (K6_HIGH), four bytes of each
   row in turn. Column c of row r, 0..63 (the weight: d scale[c / 16] (q - 32)): */
static inline int k6_value(const uint8_t *p, int r, int c) {
    const int h = c / 128, t = c % 128 / 32, i = c % 32;
    const int low = 64 * h + 32 * (t % 2) + i, high = 32 * h + i;  /* bytes of the row */
    const int q = p[K6_LOW + 64 * (low / 4) + 4 * r + low % 4] >> (4 * (t / 2)) & 15;
    return q | (p[K6_HIGH + 64 * (high / 4) + 4 * r + high % 4] >> (2 * t) & 3) << 4;
}

/* Q4_K interleaved: per 16 rows and super-block of 256 columns (K4_BYTES), the rows' d, then
   their dmin (fp16 each), their eight sub-blocks' 6-bit scales unpacked to a byte each (sub-
   block t's 16 rows at K4_SCALES + 16 t), their mins likewise (K4_MINS), then the values:
   for each of the four 32-byte chunks of a row's nibbles (chunk j: sub-block 2j in the low
   nibbles, 2j + 1 in the high), bytes 4m..4m+3 of the 16 rows, for each m. */
static inline uint8_t k4_byte(const uint8_t *p, int r, int j, int i) {  /* chunk j, byte i */
    return p[K4_VALUES + 512 * j + 64 * (i / 4) + 4 * r + i % 4];
}

/* what the rounded products take out, times the sum of q: the values' offset */
static inline int32_t stored_offset(int type) {
    return type == Q8_0 ? 128 : type == Q4_0 ? 8 : type == Q5_0 ? 16 : 0;
}

/* Byte i of row r in an interleaved block's values */
static inline uint8_t value_byte(const uint8_t *q, int r, int i) { return q[64 * (i / 4) + 4 * r + i % 4]; }

/* Column i's value of row r as stored, unsigned (Q4: 0..15, Q5: 0..31, Q8_0: the signed
   value + 128); the weight is d (v - stored_offset) (+ m) */
static inline int stored_value(int type, const uint8_t *q, int r, int i) {
    if (type == Q8_0) return value_byte(q, r, i) ^ 128;
    const int v = i < 16 ? value_byte(q, r, i) & 15 : value_byte(q, r, i - 16) >> 4;
    if (type != Q5_0 && type != Q5_1) return v;
    const uint8_t *h = q - 64 + 4 * r;  /* the row's fifth bits, regrouped: column i's at */
    return v | (int)((word(h) >> (8 * (i % 4) + i / 4)) & 1) << 4;  /* 8 (i % 4) + i / 4 */
}

/* x's blocks of 32 rounded to 8 bits: q (32 n bytes), scales d (n), sums of q (n). A block
   holding NaN or an infinity gets d NaN or infinite and q 0 (its products NaN, as exact
   ones would be); a block too small for 1 / d to be finite rounds to 0. */
static void round_to_8_bits(const float *x, int64_t n, int8_t *q, float *d, int32_t *sums) {
    for (int64_t b = 0; b < n; b++) {
        const float *v = x + 32 * b;
        float top = 0.0f;
        int nan = 0;
        for (int i = 0; i < 32; i++) {
            const float a = fabsf(v[i]);
            top = a > top ? a : top, nan |= isnan(a);
        }
        const float scale = nan ? NAN : top / 127.0f, inverse = 1.0f / scale;
        const float finite = scale != 0.0f && isfinite(inverse) ? inverse : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) sum += q[32 * b + i] = (int8_t)(finite != 0.0f ? nearbyintf(v[i] * finite) : 0.0f);
        d[b] = scale, sums[b] = sum;
    }
}

#ifdef __AVX512F__
/* Four columns' nibbles (byte n of each lane: of column 4j + n, `low`, or 16 + 4j + n) with
   their fifth bits (h: a word a row, regrouped: column 4m + n's bit at 8n + m) put in at bit 4
   of each byte; the bits above the nibble in `v` cleared. */
static inline __m512i fifth_in(__m512i v, __m512i h, int j, int low) {
    const __m512i bits = low ? _mm512_slli_epi32(h, (unsigned)(4 - j)) : _mm512_srli_epi32(h, (unsigned)j);
    return _mm512_or_si512(_mm512_and_si512(v, _mm512_set1_epi8(15)),
                           _mm512_and_si512(bits, _mm512_set1_epi8(16)));
}

/* 16 rows (p: their interleaved blocks) times one row of x (sx: its 32-value sums) → y[0..15] */
INLINE void sixteen_rows(int type, const uint8_t *p, const float *x, const float *sx, int64_t K,
                         float *y) {
    const int64_t bytes = interleaved_bytes(type), values = values_at(type);
    const int five = has_fifth(type), min = has_min(type);
    const __m512 nibbles = table(-stored_offset(type)), upper = table(16 - stored_offset(type));
    __m512 total = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32, p += bytes) {
        for (int line = 0; line < bytes; line += 64) _mm_prefetch((const char *)p + 8 * bytes + line, _MM_HINT_T0);
        const uint8_t *q = p + values;
        const __m512i h = five ? _mm512_loadu_si512((const void *)(q - 64)) : _mm512_setzero_si512();
        __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int j = 0; j < (type == Q8_0 ? 8 : 4); j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
            /* byte c of each lane: column 4j + c's value in `a`, column 4j + c + 16's in `b`
               (Q4: in the low four bits; Q5: in the low five, its fifth bit put in) */
            __m512i a = v, b = _mm512_srli_epi32(v, 4);
            if (five) a = fifth_in(a, h, j, 1), b = fifth_in(b, h, j, 0);
            for (int c = 0; c < 4; c++) {  /* column 4j + c: byte c of each lane */
                const int i = 4 * j + c;
                if (type == Q8_0) {
                    const __m512i w = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * c), 24);
                    acc[c] = _mm512_fmadd_ps(as_float(w), _mm512_set1_ps(x[k + i]), acc[c]);
                    continue;
                }
                const __m512i ac = _mm512_srli_epi32(a, 8 * c), bc = _mm512_srli_epi32(b, 8 * c);
                const __m512 wa = five ? five_bits(ac, nibbles, upper) : nibble(ac, nibbles);
                const __m512 wb = five ? five_bits(bc, nibbles, upper) : nibble(bc, nibbles);
                acc[c] = _mm512_fmadd_ps(wa, _mm512_set1_ps(x[k + i]), acc[c]);
                acc[c] = _mm512_fmadd_ps(wb, _mm512_set1_ps(x[k + i + 16]), acc[c]);
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        total = _mm512_fmadd_ps(d, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])), total);
        if (min)  /* + m times the sum of x */
            total = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))), _mm512_set1_ps(sx[k / 32]), total);
    }
    _mm512_storeu_ps(y, total);
}
#else
static void sixteen_rows(int type, const uint8_t *p, const float *x, const float *sx, int64_t K,
                         float *y) {
    const int64_t bytes = interleaved_bytes(type), values = values_at(type);
    const int min = has_min(type);
    for (int r = 0; r < 16; r++) y[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 32, p += bytes) {
        const uint8_t *q = p + values;
        for (int r = 0; r < 16; r++) {
            float sum = 0.0f;
            for (int i = 0; i < 32; i++) sum += (float)(stored_value(type, q, r, i) - stored_offset(type)) * x[k + i];
            const float d = half(p + 2 * r), s = sx[k / 32];
            y[r] += d * sum + (min ? half(p + 32 + 2 * r) * s : 0.0f);
        }
    }
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* 16 rows times one row of x rounded to 8 bits (xq, its scales xd and sums xs) → y[0..15] */
INLINE void sixteen_rows_rounded(int type, const uint8_t *p, const int8_t *xq, const float *xd,
                                 const int32_t *xs, int64_t K, float *y) {
    const int64_t bytes = interleaved_bytes(type), values = values_at(type);
    const int five = has_fifth(type), min = has_min(type);
    const __m512i low = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    __m512 total = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32, p += bytes) {
        for (int line = 0; line < bytes; line += 64) _mm_prefetch((const char *)p + 8 * bytes + line, _MM_HINT_T0);
        const uint8_t *q = p + values;
        int32_t x4[8];  /* four bytes of q at a time */
        memcpy(x4, xq + k, sizeof x4);
        const __m512i h = five ? _mm512_loadu_si512((const void *)(q - 64)) : _mm512_setzero_si512();
        __m512i acc = _mm512_setzero_si512(), acc2 = _mm512_setzero_si512();
        for (int j = 0; j < (type == Q8_0 ? 8 : 4); j++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 64 * j));
            if (type == Q8_0) {
                acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(v, flip), _mm512_set1_epi32(x4[j]));
            } else {
                const __m512i high = _mm512_srli_epi16(v, 4);  /* columns 4j..4j+3 in a, + 16 in b */
                const __m512i a = five ? fifth_in(v, h, j, 1) : _mm512_and_si512(v, low);
                const __m512i b = five ? fifth_in(high, h, j, 0) : _mm512_and_si512(high, low);
                acc = _mm512_dpbusd_epi32(acc, a, _mm512_set1_epi32(x4[j]));
                acc2 = _mm512_dpbusd_epi32(acc2, b, _mm512_set1_epi32(x4[j + 4]));
            }
        }
        const __m512i sum = _mm512_sub_epi32(_mm512_add_epi32(acc, acc2), _mm512_set1_epi32(stored_offset(type) * xs[k / 32]));
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        total = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xd[k / 32])), as_float(sum), total);
        if (min)  /* + m times the sum of the rounded x */
            total = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))), _mm512_set1_ps(xd[k / 32] * (float)xs[k / 32]), total);
    }
    _mm512_storeu_ps(y, total);
}
#else
static void sixteen_rows_rounded(int type, const uint8_t *p, const int8_t *xq, const float *xd,
                                 const int32_t *xs, int64_t K, float *y) {
    const int64_t bytes = interleaved_bytes(type), values = values_at(type);
    const int min = has_min(type);
    for (int r = 0; r < 16; r++) y[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 32, p += bytes) {
        const uint8_t *q = p + values;
        for (int r = 0; r < 16; r++) {
            int32_t sum = 0;
            for (int i = 0; i < 32; i++) sum += (stored_value(type, q, r, i) - stored_offset(type)) * xq[k + i];
            const float d = half(p + 2 * r), dx = xd[k / 32];
            y[r] += d * dx * (float)sum + (min ? half(p + 32 + 2 * r) * (dx * (float)xs[k / 32]) : 0.0f);
        }
    }
}
#endif

/* w (count, K) = rows first .. first + count - 1 of a weight whose parts are interleaved,
   decoded with the arithmetic of `decode` (so equal to the reference decoder bit for bit). */
void gguf_dequantize_interleaved(int parts, const int *types, const uint8_t *const *packed,
                                 const int64_t *rows, float *w, int64_t K, int64_t first,
                                 int64_t count) {
    (void)parts;  /* part_of finds the part */
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
        int64_t row = first + i;
        const int p = part_of(&row, rows), type = types[p], r = (int)(row % 16);
        const int min = has_min(type), offset = stored_offset(type);
        const int64_t bytes = interleaved_bytes(type);
        const uint8_t *block = packed[p] + (row / 16) * (K / 32) * bytes;
        if (type == Q4_K) {  /* s q - m, as `decode` computes it */
            for (int64_t k = 0; k < K; k += 256, block += K4_BYTES) {
                const float d = half(block + 2 * r), dmin = half(block + 32 + 2 * r);
                for (int t = 0; t < 8; t++) {
                    const float sc = d * (float)block[K4_SCALES + 16 * t + r];
                    const float mn = dmin * (float)block[K4_MINS + 16 * t + r];
                    for (int c = 0; c < 32; c++) {
                        const int q = (k4_byte(block, r, t / 2, c) >> (4 * (t % 2))) & 15;
                        w[i * K + k + 32 * t + c] = sc * (float)q - mn;
                    }
                }
            }
            continue;
        }
        if (type == Q6_K) {  /* (d scale) (q - 32), as `decode` computes it */
            for (int64_t k = 0; k < K; k += 256, block += K6_BYTES) {
                const float d = half(block + 2 * r);
                for (int c = 0; c < 256; c++) {
                    const float s = d * (float)(int8_t)block[K6_SCALES + 16 * (c / 16) + r];
                    w[i * K + k + c] = s * (float)(k6_value(block, r, c) - 32);
                }
            }
            continue;
        }
        for (int64_t k = 0; k < K; k += 32, block += bytes) {
            const float d = half(block + 2 * r), m = min ? half(block + 32 + 2 * r) : 0.0f;
            const uint8_t *q = block + values_at(type);
            float *out = w + i * K + k;
            for (int c = 0; c < 32; c++) {
                const int v = stored_value(type, q, r, c);
                out[c] = type == Q8_0 ? (float)(v - offset) * d
                         : min       ? d * (float)v + m
                                     : d * (float)(v - offset);
            }
        }
    }
}

/* Without AVX-512 (or VNNI): row r's sub-block t, s (sum q x) - m (sum x), x given exact (x, xq NULL)
   or rounded (xq and its scale dx); `total` its sum of x (times dx where rounded). */
static inline float k4_row(const uint8_t *p, int r, int t, const float *x, const int8_t *xq, float dx,
                    float total) {
    float sum = 0.0f;
    for (int c = 0; c < 32; c++) {
        const int q = (k4_byte(p, r, t / 2, c) >> (4 * (t % 2))) & 15;
        sum += xq ? (float)(q * xq[c]) : (float)q * x[c];
    }
    const float s = half(p + 2 * r) * (float)p[K4_SCALES + 16 * t + r];
    const float m = half(p + 32 + 2 * r) * (float)p[K4_MINS + 16 * t + r];
    return s * (xq ? dx * sum : sum) - m * total;
}

/* Q4_K's 16 rows times one row of x: exact (x in fp32, sx its 32-value sums) or rounded
   (xq, xd, xs: x rounded to 8 bits). A sub-block's sum is s (sum q x) - m (sum x), its s and m
   d and dmin times the unpacked bytes, 16 rows at a time. */
#if defined(__AVX512F__)
/* A super-block's 16 rows: prefetch two ahead, then their d and dmin */
static inline void k4_start(const uint8_t *p, __m512 *d, __m512 *dmin) {
    for (int line = 0; line < K4_BYTES; line += 64) _mm_prefetch((const char *)p + 2 * K4_BYTES + line, _MM_HINT_T0);
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    *dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
}

/* total + s (sums) - m (the sum of x, dx): sub-block t's 16 rows, s = d sc and m = dmin mn */
static inline __m512 k4_add(const uint8_t *p, int t, __m512 d, __m512 dmin, __m512 sums,
                            float dx, __m512 total) {
    const __m512 s = _mm512_mul_ps(d, as_float(widen(p + K4_SCALES + 16 * t)));
    const __m512 mn = _mm512_mul_ps(dmin, as_float(widen(p + K4_MINS + 16 * t)));
    return _mm512_fnmadd_ps(mn, _mm512_set1_ps(dx), _mm512_fmadd_ps(s, sums, total));
}

INLINE void sixteen_k4(const uint8_t *p, const float *x, const float *sx, int64_t K, float *y) {
    const __m512 nibbles = table(0);
    __m512 total = _mm512_setzero_ps(), d, dmin;
    for (int64_t k = 0; k < K; k += 256, p += K4_BYTES) {
        k4_start(p, &d, &dmin);
        for (int j = 0; j < 4; j++) {
            __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
            const float *x0 = x + k + 64 * j, *x1 = x0 + 32;
            for (int m = 0; m < 8; m++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + K4_VALUES + 512 * j + 64 * m));
                for (int c = 0; c < 4; c++) {  /* column 4m + c: byte c of each lane */
                    const __m512i w = _mm512_srli_epi32(v, 8 * c);
                    lo = _mm512_fmadd_ps(nibble(w, nibbles), _mm512_set1_ps(x0[4 * m + c]), lo);
                    hi = _mm512_fmadd_ps(nibble(_mm512_srli_epi32(w, 4), nibbles), _mm512_set1_ps(x1[4 * m + c]), hi);
                }
            }
            total = k4_add(p, 2 * j, d, dmin, lo, sx[k / 32 + 2 * j], total);
            total = k4_add(p, 2 * j + 1, d, dmin, hi, sx[k / 32 + 2 * j + 1], total);
        }
    }
    _mm512_storeu_ps(y, total);
}
#else
static void sixteen_k4(const uint8_t *p, const float *x, const float *sx, int64_t K, float *y) {
    for (int r = 0; r < 16; r++) y[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 256, p += K4_BYTES)
        for (int r = 0; r < 16; r++)
            for (int t = 0; t < 8; t++) y[r] += k4_row(p, r, t, x + k + 32 * t, NULL, 0.0f, sx[k / 32 + t]);
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
INLINE void sixteen_k4_rounded(const uint8_t *p, const int8_t *xq, const float *xd,
                               const int32_t *xs, int64_t K, float *y) {
    const __m512i low = _mm512_set1_epi8(15);
    __m512 total = _mm512_setzero_ps(), d, dmin;
    for (int64_t k = 0; k < K; k += 256, p += K4_BYTES) {
        k4_start(p, &d, &dmin);
        for (int j = 0; j < 4; j++) {
            const int64_t b0 = k / 32 + 2 * j;  /* x's blocks of 32: sub-blocks 2j and 2j + 1 */
            int32_t x0[8], x1[8];
            memcpy(x0, xq + 32 * b0, sizeof x0), memcpy(x1, xq + 32 * b0 + 32, sizeof x1);
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            for (int m = 0; m < 8; m++) {
                const __m512i v = _mm512_loadu_si512((const void *)(p + K4_VALUES + 512 * j + 64 * m));
                lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(v, low), _mm512_set1_epi32(x0[m]));
                hi = _mm512_dpbusd_epi32(hi, _mm512_and_si512(_mm512_srli_epi16(v, 4), low), _mm512_set1_epi32(x1[m]));
            }
            for (int h = 0; h < 2; h++) {  /* the sums times x's scale: s dx sum q xq */
                const __m512 sums = _mm512_mul_ps(_mm512_set1_ps(xd[b0 + h]), as_float(h ? hi : lo));
                total = k4_add(p, 2 * j + h, d, dmin, sums, xd[b0 + h] * (float)xs[b0 + h], total);
            }
        }
    }
    _mm512_storeu_ps(y, total);
}
#else
static void sixteen_k4_rounded(const uint8_t *p, const int8_t *xq, const float *xd,
                               const int32_t *xs, int64_t K, float *y) {
    for (int r = 0; r < 16; r++) y[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 256, p += K4_BYTES)
        for (int r = 0; r < 16; r++)
            for (int t = 0; t < 8; t++) {
                const int64_t b = k / 32 + t;
                y[r] += k4_row(p, r, t, NULL, xq + 32 * b, xd[b], xd[b] * (float)xs[b]);
            }
}
#endif

/* Q6_K's 16 rows times one row of x: exact (x in fp32) or rounded (xq and its scales xd,
   xh: its sums of 16 values, which the -32 multiplies). A scale covers 16 columns: their
   sums grow four columns at a time, then are scaled by d times the scale, 16 rows at once. */
static inline float k6_row(const uint8_t *p, int r, int u, const float *x, const int8_t *xq) {
    float sum = 0.0f;  /* row r's 16 columns of scale u: sum (q - 32) x, or (q - 32) xq */
    for (int c = 0; c < 16; c++) {
        const int q = k6_value(p, r, 16 * u + c) - 32;
        sum += xq ? (float)(q * xq[c]) : (float)q * x[c];
    }
    return half(p + 2 * r) * (float)(int8_t)p[K6_SCALES + 16 * u + r] * sum;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
INLINE void sixteen_k6(const uint8_t *p, const float *x, int64_t K, float *y) {
    const __m512i fifteen = _mm512_set1_epi8(15), three = _mm512_set1_epi8(3), mid = _mm512_set1_epi8(32);
    __m512 total = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 256, p += K6_BYTES) {
        for (int line = 0; line < K6_BYTES; line += 64) _mm_prefetch((const char *)p + 2 * K6_BYTES + line, _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        for (int u = 0; u < 16; u++) {  /* 16 columns a scale */
            const int h = u / 8, t = u % 8 / 2, i = 16 * (u % 2);
            __m512 acc = _mm512_setzero_ps();
            for (int m = 0; m < 4; m++) {  /* four columns: byte c of each lane */
                const int low = 64 * h + 32 * (t % 2) + i + 4 * m, high = 32 * h + i + 4 * m;
                const __m512i vl = _mm512_loadu_si512((const void *)(p + K6_LOW + 16 * low));
                const __m512i vh = _mm512_loadu_si512((const void *)(p + K6_HIGH + 16 * high));
                const __m512i q = _mm512_sub_epi8(_mm512_or_si512(  /* q - 32, a signed byte each */
                    _mm512_and_si512(_mm512_srli_epi16(vl, 4 * (t / 2)), fifteen),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(vh, 2 * t), three), 4)), mid);
                for (int c = 0; c < 4; c++) {
                    const __m512i v = _mm512_srai_epi32(_mm512_slli_epi32(q, 24 - 8 * c), 24);
                    acc = _mm512_fmadd_ps(as_float(v), _mm512_set1_ps(x[k + 16 * u + 4 * m + c]), acc);
                }
            }
            const __m128i scales = _mm_loadu_si128((const __m128i *)(p + K6_SCALES + 16 * u));
            const __m512 s = _mm512_mul_ps(d, as_float(_mm512_cvtepi8_epi32(scales)));
            total = _mm512_fmadd_ps(s, acc, total);
        }
    }
    _mm512_storeu_ps(y, total);
}
#else
static void sixteen_k6(const uint8_t *p, const float *x, int64_t K, float *y) {
    for (int r = 0; r < 16; r++) y[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 256, p += K6_BYTES)
        for (int r = 0; r < 16; r++)
            for (int u = 0; u < 16; u++) y[r] += k6_row(p, r, u, x + k + 16 * u, NULL);
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
INLINE void sixteen_k6_rounded(const uint8_t *p, const int8_t *xq, const float *xd,
                               const int32_t *xh, int64_t K, float *y) {
    const __m512i fifteen = _mm512_set1_epi8(15), three = _mm512_set1_epi8(3);
    __m512 total = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 256, p += K6_BYTES) {
        for (int line = 0; line < K6_BYTES; line += 64) _mm_prefetch((const char *)p + 2 * K6_BYTES + line, _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        for (int u = 0; u < 16; u++) {
            const int h = u / 8, t = u % 8 / 2, i = 16 * (u % 2);
            int32_t x4[4];  /* four bytes of xq at a time */
            memcpy(x4, xq + k + 16 * u, sizeof x4);
            __m512i acc = _mm512_setzero_si512();
            for (int m = 0; m < 4; m++) {
                const int low = 64 * h + 32 * (t % 2) + i + 4 * m, high = 32 * h + i + 4 * m;
                const __m512i vl = _mm512_loadu_si512((const void *)(p + K6_LOW + 16 * low));
                const __m512i vh = _mm512_loadu_si512((const void *)(p + K6_HIGH + 16 * high));
                const __m512i q = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(vl, 4 * (t / 2)), fifteen),
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(vh, 2 * t), three), 4));
                acc = _mm512_dpbusd_epi32(acc, q, _mm512_set1_epi32(x4[m]));
            }
            const int64_t at = (k + 16 * u) / 16;  /* sum (q - 32) xq = acc - 32 sum xq */
            const __m512i sum = _mm512_sub_epi32(acc, _mm512_set1_epi32(32 * xh[at]));
            const __m128i scales = _mm_loadu_si128((const __m128i *)(p + K6_SCALES + 16 * u));
            const __m512 s = _mm512_mul_ps(d, as_float(_mm512_cvtepi8_epi32(scales)));
            total = _mm512_fmadd_ps(_mm512_mul_ps(s, _mm512_set1_ps(xd[at / 2])), as_float(sum), total);
        }
    }
    _mm512_storeu_ps(y, total);
}
#else
static void sixteen_k6_rounded(const uint8_t *p, const int8_t *xq, const float *xd,
                               const int32_t *xh, int64_t K, float *y) {
    (void)xh;
    for (int r = 0; r < 16; r++) y[r] = 0.0f;
    for (int64_t k = 0; k < K; k += 256, p += K6_BYTES)
        for (int r = 0; r < 16; r++)
            for (int u = 0; u < 16; u++)
                y[r] += xd[(k + 16 * u) / 32] * k6_row(p, r, u, NULL, xq + k + 16 * u);
}
#endif

/* y (M, N) = x (M, K) times the transpose of a weight whose parts are interleaved (each part's
   rows a multiple of 16), a row of x at a time; rounded: x rounded to 8 bits first. */
void gguf_matmul_interleaved(int parts, const int *types, const uint8_t *const *packed,
                             const int64_t *rows, const float *x, float *y, int64_t M, int64_t K,
                             int rounded) {
    int64_t N = 0;
    for (int p = 0; p < parts; p++) N += rows[p];
    const int64_t n = M * (K / 32);
    float *sx = NULL, *xd = NULL;  /* exact: x's 32-value sums; rounded: x rounded */
    int8_t *xq = NULL;
    int32_t *xs = NULL, *xh = NULL;  /* rounded: q's sums of 32 values, and of 16 (Q6_K) */
    if (rounded) {
        xd = malloc(sizeof(float) * (size_t)n), xs = malloc(sizeof(int32_t) * (size_t)n);
        xq = malloc((size_t)(M * K)), xh = malloc(sizeof(int32_t) * (size_t)(2 * n));
        round_to_8_bits(x, n, xq, xd, xs);
        for (int64_t i = 0; i < 2 * n; i++) {
            int32_t sum = 0;
            for (int c = 0; c < 16; c++) sum += xq[16 * i + c];
            xh[i] = sum;
        }
    } else {
        sx = block_sums(x, n);
    }
    #pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++) {
        int64_t row = 16 * g;
        const int p = part_of(&row, rows);
        const int type = types[p];
        const uint8_t *group = packed[p] + (row / 16) * (K / 32) * interleaved_bytes(type);
        for (int64_t m = 0; m < M; m++) {
            float out[16];
            const int64_t b = m * (K / 32);
            #define SIXTEEN(T) (rounded ? sixteen_rows_rounded(T, group, xq + m * K, xd + b, xs + b, K, out) \
                                        : sixteen_rows(T, group, x + m * K, sx + b, K, out))
            switch (type) {  /* the type a constant in each copy */
                case Q4_K:
                    if (rounded) sixteen_k4_rounded(group, xq + m * K, xd + b, xs + b, K, out);
                    else sixteen_k4(group, x + m * K, sx + b, K, out);
                    break;
                case Q6_K:
                    if (rounded) sixteen_k6_rounded(group, xq + m * K, xd + b, xh + 2 * b, K, out);
                    else sixteen_k6(group, x + m * K, K, out);
                    break;
                case Q4_0: SIXTEEN(Q4_0); break;
                case Q4_1: SIXTEEN(Q4_1); break;
                case Q5_0: SIXTEEN(Q5_0); break;
                case Q5_1: SIXTEEN(Q5_1); break;
                default: SIXTEEN(Q8_0);
            }
            #undef SIXTEEN
            memcpy(y + m * N + 16 * g, out, sizeof out);
        }
    }
    free(sx), free(xd), free(xq), free(xs), free(xh);
}
