/* What the small-batch kernels share: the instruction sets they are compiled
 * for (per function: the rest of the extension stays baseline x86-64), ggml's
 * block layouts, and the pieces of ggml's AVX2 arithmetic every kernel
 * repeats.  The helpers take the AVX2 target, so both kernel sets inline them
 * (AVX-512's target includes AVX2's). */
#ifndef ELELEM_KERNELS_SIMD_H
#define ELELEM_KERNELS_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define SMALL_BATCH_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define SMALL_BATCH_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

#define BLOCK 32
#define QK_K 256

typedef uint16_t half_bits;

typedef struct { half_bits d; int8_t qs[BLOCK]; } block_q8_0_t;                 /* 34 bytes */
typedef struct { half_bits d; half_bits s; int8_t qs[BLOCK]; } block_q8_1_t;    /* 36 bytes */
typedef struct { half_bits d; uint8_t qs[BLOCK / 2]; } block_q4_0_t;            /* 18 bytes */
typedef struct { half_bits d; half_bits m; uint8_t qs[BLOCK / 2]; } block_q4_1_t; /* 20 bytes */
typedef struct { half_bits d; uint8_t qh[4]; uint8_t qs[BLOCK / 2]; } block_q5_0_t; /* 22 bytes */
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; half_bits d; } block_q6_K_t;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K_t;

static SMALL_BATCH_AVX2_TARGET inline float half_to_float(half_bits h) { return _cvtsh_ss(h); }

/* ggml's hsum_float_8: this order, no other. */
static SMALL_BATCH_AVX2_TARGET inline float hsum8(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* A 32-value block's 4-bit values as bytes 0..15 (ggml's bytes_from_nibbles_32). */
static SMALL_BATCH_AVX2_TARGET inline __m256i nibbles(const uint8_t * qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *) qs);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(_mm256_set1_epi8(0xF), b);
}

/* Q5_0's fifth bits as ggml applies them: 0xF0 where the bit is clear, else 0. */
static SMALL_BATCH_AVX2_TARGET inline __m256i q5_high_bits(const uint8_t * qh) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int) bits), shuffle);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_andnot_si256(_mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1)), _mm256_set1_epi8((char) 0xF0));
}

/* A Q6_K super-block's 8 vectors of 32 six-bit values (0..63), unpacked as ggml unpacks them. */
static SMALL_BATCH_AVX2_TARGET inline void unpack_q6(const block_q6_K_t * b, __m256i q[8]) {
    const __m256i m3 = _mm256_set1_epi8(3), m15 = _mm256_set1_epi8(15);
    for (int j = 0; j < 2; j++) {
        const __m256i bits1 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * j));
        const __m256i bits2 = _mm256_loadu_si256((const __m256i *) (b->ql + 64 * j + 32));
        const __m256i high = _mm256_loadu_si256((const __m256i *) (b->qh + 32 * j));
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(high, m3), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(12)), 2);
        const __m256i h2 = _mm256_and_si256(high, _mm256_set1_epi8(48));
        const __m256i h3 = _mm256_srli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(-64)), 2);
        q[4 * j + 0] = _mm256_or_si256(_mm256_and_si256(bits1, m15), h0);
        q[4 * j + 1] = _mm256_or_si256(_mm256_and_si256(bits2, m15), h1);
        q[4 * j + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits1, 4), m15), h2);
        q[4 * j + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits2, 4), m15), h3);
    }
}

/* Scales 2v and 2v+1 of a Q6_K super-block as 16 int16 (ggml's get_scale_shuffle): 8 of each. */
static SMALL_BATCH_AVX2_TARGET inline __m256i q6_vector_scales(const int8_t * scales, int v) {
    return _mm256_cvtepi8_epi16(_mm_set_epi64x(0x0101010101010101LL * (uint8_t) scales[2 * v + 1],
                                               0x0101010101010101LL * (uint8_t) scales[2 * v]));
}

#endif
