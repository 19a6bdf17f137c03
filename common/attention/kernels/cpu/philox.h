/* Philox4x32-10 (Salmon et al., 2011; the generator of Triton's tl.randint4x) for the CPU kernels of
 * common/attention/kernels (bam_rows.c, edge_bam.c): one call of counter (c0, c1, c2, c3) and key (k0, k1)
 * gives four 32-bit words; philox_lanes gives those of PHILOX_COUNTERS consecutive counters at once. */
#ifndef ATTN_PHILOX_H
#define ATTN_PHILOX_H

#include <stdint.h>

#define PHILOX_COUNTERS 64 /* counters of one philox_lanes call at most (a multiple of 16) */

/* Philox4x32-10 of counter (c0, c1, c2, c3) and key (k0, k1): out[0..3] */
static inline void philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1,
                          uint32_t *o0, uint32_t *o1, uint32_t *o2, uint32_t *o3) {
    for (int r = 0; r < 10; ++r) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        c0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        c2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    *o0 = c0; *o1 = c1; *o2 = c2; *o3 = c3;
}

#if defined(__AVX2__)
#include <immintrin.h>

/* 32-bit a * m of eight lanes: the high and the low halves */
static inline void mulhilo8(__m256i a, __m256i m, __m256i *hi, __m256i *lo) {
    const __m256i even = _mm256_mul_epu32(a, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

/* philox() of counters (b0 + b, c1, c2, c3), b < nb (a multiple of 16), two vectors at a time
 * (their multiplies overlap): word l of counter b at lane[l][b] */
static void philox_lanes(uint32_t (*lane)[PHILOX_COUNTERS], int64_t nb, uint32_t b0, uint32_t c1, uint32_t c2,
                         uint32_t c3, uint32_t k0, uint32_t k1) {
    const __m256i A = _mm256_set1_epi32((int)0xD2511F53u), B = _mm256_set1_epi32((int)0xCD9E8D57u);
    const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t b = 0; b < nb; b += 16) {
        __m256i x0[2], x1[2], x2[2], x3[2];
        for (int v = 0; v < 2; ++v) {
            x0[v] = _mm256_add_epi32(_mm256_set1_epi32((int)(b0 + (uint32_t)b + 8 * v)), step);
            x1[v] = _mm256_set1_epi32((int)c1);
            x2[v] = _mm256_set1_epi32((int)c2);
            x3[v] = _mm256_set1_epi32((int)c3);
        }
        uint32_t key0 = k0, key1 = k1;
        for (int r = 0; r < 10; ++r) {
            const __m256i K0 = _mm256_set1_epi32((int)key0), K1 = _mm256_set1_epi32((int)key1);
            for (int v = 0; v < 2; ++v) {
                __m256i hi0, lo0, hi1, lo1;
                mulhilo8(x0[v], A, &hi0, &lo0);
                mulhilo8(x2[v], B, &hi1, &lo1);
                x0[v] = _mm256_xor_si256(_mm256_xor_si256(hi1, x1[v]), K0);
                x2[v] = _mm256_xor_si256(_mm256_xor_si256(hi0, x3[v]), K1);
                x1[v] = lo1;
                x3[v] = lo0;
            }
            key0 += 0x9E3779B9u;
            key1 += 0xBB67AE85u;
        }
        for (int v = 0; v < 2; ++v) {
            _mm256_storeu_si256((__m256i *)&lane[0][b + 8 * v], x0[v]);
            _mm256_storeu_si256((__m256i *)&lane[1][b + 8 * v], x1[v]);
            _mm256_storeu_si256((__m256i *)&lane[2][b + 8 * v], x2[v]);
            _mm256_storeu_si256((__m256i *)&lane[3][b + 8 * v], x3[v]);
        }
    }
}
#else
static void philox_lanes(uint32_t (*lane)[PHILOX_COUNTERS], int64_t nb, uint32_t b0, uint32_t c1, uint32_t c2,
                         uint32_t c3, uint32_t k0, uint32_t k1) {
#pragma omp simd
    for (int64_t b = 0; b < nb; ++b)
        philox(b0 + (uint32_t)b, c1, c2, c3, k0, k1, &lane[0][b], &lane[1][b], &lane[2][b], &lane[3][b]);
}
#endif

/* u = (m + 1/2) 2^-23 in the open interval (0, 1), m the word's top 23 bits */
static inline float open_uniform(uint32_t w) { return ((float)(w >> 9) + 0.5f) * 0x1p-23f; }

#endif
