/* Matmuls of 1 to 8 columns for steps of generated tokens, on x86 CPUs with
 * AVX-512 VNNI.  See small_batch.h for what they compute and why.
 *
 * How the arithmetic stays ggml's.  On an AVX2 build, ggml's one-column dot
 * products for Q8_0, Q5_0, Q4_0 (against Q8_0) and Q4_1 (against Q8_1) all
 * run the same loop: per 32-value block, eight int32 lanes, lane j the sum
 * of the products of values 4j..4j+3 (exact integers, whichever instructions
 * make them), converted to float, then acc = fma(d_w * d_x, lanes, acc);
 * at the end the eight lanes are summed in one fixed order (hsum8, simd.h).
 * Q4_1 adds a scalar sum of m_w * s_x, contracted to an fma by the compiler.
 * Here each zmm holds two columns, one per 256-bit half, so each half runs
 * exactly that loop: same integers, same products, same fma order, same sum.
 *
 * Where the time goes instead.  ggml runs that loop once per column, so a
 * step of n tokens decodes every weight block n times.  Here a block is
 * decoded once per row and serves every column: its values are made unsigned
 * (+128) for vpdpbusd, whose lanes then come out 128 * (sum of the column's
 * four values) too high; the prepare op stores that correction per column
 * and block, with the columns' scales and their bytes paired for the zmm.
 * Q6_K has a kernel of its own: small_batch_avx512_q6_k.c. */
#include "small_batch_isa.h"
#include "small_batch_avx512_q6_k.h"
#include "simd.h"

/* One block of a pair of columns, as the matmul reads it. */
typedef struct {
    int8_t values[2 * BLOCK];   /* the first column's 32 values, then the second's */
    int32_t correction[16];     /* per lane: -128 * (sum of the lane's 4 values); 0 for Q4_1 */
    float scale[16];            /* the first column's d in lanes 0-7, the second's in 8-15 */
    float sum[16];              /* Q8_1's s of the two columns in lanes 0 and 1 (for Q4_1) */
} pair_block;

#define TARGET SMALL_BATCH_AVX512_TARGET

int64_t elelem_small_batch_avx512_prepared_bytes(enum ggml_type weight, int64_t n_in, int64_t n_columns) {
    if (weight == GGML_TYPE_Q6_K) {
        return elelem_small_batch_q6_k_prepared_bytes(n_in, n_columns);
    }
    return (n_in / BLOCK) * ((n_columns + 1) / 2) * (int64_t) sizeof(pair_block);
}

/* Columns 2p and 2p+1 of block ib (an odd last column pairs with itself;
 * its second half is computed and dropped). */
static TARGET void prepare_pair(const struct ggml_tensor * x, int64_t p, int64_t ib, pair_block * out) {
    const int64_t n = x->ne[1];
    const int64_t c0 = 2 * p, c1 = 2 * p + 1 < n ? 2 * p + 1 : 2 * p;
    const char * row0 = (const char *) x->data + c0 * x->nb[1];
    const char * row1 = (const char *) x->data + c1 * x->nb[1];
    const int8_t * q0, * q1;
    float d0, d1, s0 = 0.0f, s1 = 0.0f;
    if (x->type == GGML_TYPE_Q8_1) {
        const block_q8_1_t * b0 = (const block_q8_1_t *) row0 + ib, * b1 = (const block_q8_1_t *) row1 + ib;
        q0 = b0->qs; q1 = b1->qs;
        d0 = half_to_float(b0->d); d1 = half_to_float(b1->d);
        s0 = half_to_float(b0->s); s1 = half_to_float(b1->s);
    } else {
        const block_q8_0_t * b0 = (const block_q8_0_t *) row0 + ib, * b1 = (const block_q8_0_t *) row1 + ib;
        q0 = b0->qs; q1 = b1->qs;
        d0 = half_to_float(b0->d); d1 = half_to_float(b1->d);
    }
    memcpy(out->values, q0, BLOCK);
    memcpy(out->values + BLOCK, q1, BLOCK);
    const __m512i values = _mm512_loadu_si512(out->values);
    const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char) 128), values);
    _mm512_storeu_si512(out->correction,
                        x->type == GGML_TYPE_Q8_1 ? _mm512_setzero_si512() : _mm512_sub_epi32(_mm512_setzero_si512(), sums));
    _mm512_storeu_ps(out->scale, _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1));
    memset(out->sum, 0, sizeof out->sum);
    out->sum[0] = s0;
    out->sum[1] = s1;
}

void elelem_small_batch_avx512_prepare(const struct ggml_tensor * x, int ith, int nth, void * out_data) {
    if (x->type == GGML_TYPE_Q8_K) {
        elelem_small_batch_q6_k_prepare(x, ith, nth, out_data);
        return;
    }
    const int64_t nb = x->ne[0] / BLOCK, pairs = (x->ne[1] + 1) / 2, total = nb * pairs;
    pair_block * out = (pair_block *) out_data;
    for (int64_t i = total * ith / nth; i < total * (ith + 1) / nth; i++) {
        const int64_t ib = i / pairs, p = i % pairs;
        prepare_pair(x, p, ib, &out[ib * pairs + p]);  /* a block's pairs side by side */
    }
}

#define UNSIGNED(v) _mm256_xor_si256((v), _mm256_set1_epi8((char) 0x80))   /* v + 128 as u8 */

/* Rows r0..r1 of the product, NP column pairs at a time.  UNPACK turns the
 * weight block b into u8, its 32 values as unsigned bytes; HAS_MIN adds
 * Q4_1's m * s term. */
#define SMALL_BATCH_KERNEL(NAME, BLOCK_T, UNPACK, HAS_MIN, ADD_MIN)                                              \
static inline __attribute__((always_inline)) TARGET void NAME##_pairs(                                  \
        const int NP, int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,           \
        const pair_block * pb, int64_t n, float * out, size_t out_stride) {                            \
    for (int64_t r = r0; r < r1; r++) {                                                                 \
        const BLOCK_T * xb = (const BLOCK_T *) (w + r * w_stride);                                     \
        __m512 acc[4];                                                                                  \
        __m128 mins[4];                                                                                 \
        _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) { acc[p] = _mm512_setzero_ps(); mins[p] = _mm_setzero_ps(); } \
        for (int64_t ib = 0; ib < nb; ib++) {                                                           \
            const BLOCK_T * b = &xb[ib];                                                                \
            UNPACK;                                                                                     \
            const __m512i xu = _mm512_broadcast_i64x4(u8);                                              \
            const __m512 dw = _mm512_set1_ps(half_to_float(b->d));                                      \
            const pair_block * y = &pb[ib * NP];                                                        \
            _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {                                      \
                const __m512i lanes = _mm512_dpbusd_epi32(_mm512_loadu_si512(y[p].correction), xu,      \
                                                          _mm512_loadu_si512(y[p].values));             \
                acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_loadu_ps(y[p].scale)),                \
                                         _mm512_cvtepi32_ps(lanes), acc[p]);                            \
                ADD_MIN;                                                                                \
            }                                                                                           \
        }                                                                                               \
        _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {                                          \
            float first = hsum8(_mm512_castps512_ps256(acc[p]));                                       \
            float second = hsum8(_mm512_extractf32x8_ps(acc[p], 1));                                    \
            if (HAS_MIN) {  /* no "+ 0.0f" otherwise: it would turn -0.0 into +0.0 */                    \
                first += _mm_cvtss_f32(mins[p]);                                                        \
                second += _mm_cvtss_f32(_mm_shuffle_ps(mins[p], mins[p], 1));                           \
            }                                                                                           \
            out[(2 * p) * out_stride + r] = first;                                                      \
            if (2 * p + 1 < n) out[(2 * p + 1) * out_stride + r] = second;                              \
        }                                                                                               \
    }                                                                                                   \
}                                                                                                       \
static TARGET void NAME(int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,          \
                        const pair_block * pb, int64_t n, float * out, size_t out_stride) {            \
    switch ((n + 1) / 2) {  /* a constant count of pairs keeps the accumulators in registers */         \
        case 1: NAME##_pairs(1, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;               \
        case 2: NAME##_pairs(2, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;               \
        case 3: NAME##_pairs(3, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;               \
        default: NAME##_pairs(4, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;              \
    }                                                                                                   \
}

SMALL_BATCH_KERNEL(rows_q8_0, block_q8_0_t,
                   const __m256i u8 = UNSIGNED(_mm256_loadu_si256((const __m256i *) b->qs)), 0, (void) 0)
SMALL_BATCH_KERNEL(rows_q5_0, block_q5_0_t,
                   const __m256i u8 = UNSIGNED(_mm256_or_si256(nibbles(b->qs), q5_high_bits(b->qh))), 0, (void) 0)
SMALL_BATCH_KERNEL(rows_q4_0, block_q4_0_t,
                   const __m256i u8 = UNSIGNED(_mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8))), 0, (void) 0)
/* Q4_1's values are unsigned already and Q8_1 carries no correction. */
SMALL_BATCH_KERNEL(rows_q4_1, block_q4_1_t, const __m256i u8 = nibbles(b->qs), 1,
                   mins[p] = _mm_fmadd_ps(_mm_set1_ps(half_to_float(b->m)), _mm_loadu_ps(y[p].sum), mins[p]))

void elelem_small_batch_avx512_matmul(struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * w = dst->src[0];
    const pair_block * pb = (const pair_block *) dst->src[1]->data;
    const int64_t m = w->ne[1], n = dst->ne[1], nb = w->ne[0] / BLOCK;  /* 32-value blocks */
    const int64_t r0 = m * ith / nth, r1 = m * (ith + 1) / nth;
    const char * wd = (const char *) w->data;
    float * out = (float *) dst->data;
    const size_t out_stride = dst->nb[1] / sizeof(float);
    if (r0 >= r1) {
        return;
    }
    switch (w->type) {
        case GGML_TYPE_Q8_0: rows_q8_0(nb, wd, w->nb[1], r0, r1, pb, n, out, out_stride); break;
        case GGML_TYPE_Q5_0: rows_q5_0(nb, wd, w->nb[1], r0, r1, pb, n, out, out_stride); break;
        case GGML_TYPE_Q4_0: rows_q4_0(nb, wd, w->nb[1], r0, r1, pb, n, out, out_stride); break;
        case GGML_TYPE_Q4_1: rows_q4_1(nb, wd, w->nb[1], r0, r1, pb, n, out, out_stride); break;
        case GGML_TYPE_Q6_K:
            elelem_small_batch_q6_k_rows(w->ne[0] / 256, wd, w->nb[1], r0, r1, pb, n, out, out_stride);
            break;
        default: break;  /* the graph builder asks elelem_small_batch_serves() first */
    }
}
