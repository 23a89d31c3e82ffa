/* What the small-batch kernels share: the instruction set they are compiled
 * for (per function: the rest of the extension stays baseline x86-64) and
 * the two pieces of ggml's AVX2 arithmetic every type repeats. */
#ifndef ELELEM_KERNELS_SIMD_H
#define ELELEM_KERNELS_SIMD_H

#include <immintrin.h>
#include <stdint.h>

#define SMALL_BATCH_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

typedef uint16_t half_bits;

static SMALL_BATCH_TARGET inline float half_to_float(half_bits h) { return _cvtsh_ss(h); }

/* ggml's hsum_float_8: this order, no other. */
static SMALL_BATCH_TARGET inline float hsum8(__m256 x) {
    __m128 r = _mm256_extractf128_ps(x, 1);
    r = _mm_add_ps(r, _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

#endif
