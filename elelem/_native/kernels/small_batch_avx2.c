/* Matmuls of 1 to 8 columns for steps of generated tokens, on x86 CPUs with
 * AVX2, FMA and F16C but no AVX-512 VNNI (Zen 2 and 3, Haswell to Alder
 * Lake).  See small_batch.h for what they compute and why.
 *
 * Each column has a ymm of its own and runs exactly ggml's AVX2 one-column
 * loop (small_batch_avx512.c describes it for the 32-value types;
 * small_batch_avx512_q6_k.c for Q6_K): the same int32 lanes, made by the
 * same instructions (ggml's sign trick, maddubs, madd), the same float
 * products and fma, the same final hsum8.  What a column no longer pays for
 * is the weight: each block is loaded and unpacked, and its absolute values
 * taken, once per row for all the columns.
 *
 * The prepare op lays the quantized columns out block by block, each
 * block's columns side by side, with their scales already in float. */
#include "small_batch_isa.h"
#include "small_batch.h"
#include "simd.h"

#define TARGET SMALL_BATCH_AVX2_TARGET

/* The prepared columns of the 32-value types: first each block's columns'
 * values side by side (32 bytes a column, so that in a buffer aligned to 32
 * no load straddles a cache line), then for each block its lanes: the
 * columns' d and Q8_1's s (Q4_1), a float for each of 8 columns, 0 past the
 * last.  So one vmulps makes every column's d_column * d_weight, and one fma
 * updates every column's sum of m * s, where a 68-byte block (values, d in
 * every lane, s) took a vmulps per column and Q4_1 a scalar fma per column
 * whose sums spilled to the stack at 8 columns.  Measured on Zen 3 by
 * benchmarks/kernel_cycles.py, 8 columns: Q4_1 2.70-2.86 -> 2.34-2.46
 * cycles per column-block, Q8_0 and Q5_0 even. */
typedef struct { int8_t values[BLOCK]; } column_block;
typedef struct { float scale[ELELEM_SMALL_BATCH_MAX_COLUMNS]; float sum[ELELEM_SMALL_BATCH_MAX_COLUMNS]; } block_lanes;

/* One Q8_K super-block of one column, padded to a multiple of 32 bytes, so
 * that its loads do not straddle cache lines either. */
typedef struct {
    int8_t values[QK_K];
    int16_t bsums[QK_K / 16];
    float scale;
    char padding[28];
} column_superblock;

_Static_assert(sizeof(column_block) == 32 && sizeof(block_lanes) == 64, "whole 32-byte vectors");
_Static_assert(sizeof(column_superblock) % 32 == 0, "column_superblock: whole 32-byte vectors");

static inline block_lanes * lanes_of(const void * prepared, int64_t nb, int64_t n_columns) {
    return (block_lanes *) ((column_block *) prepared + nb * n_columns);
}

int64_t elelem_small_batch_avx2_prepared_bytes(enum ggml_type weight, int64_t n_in, int64_t n_columns) {
    if (weight == GGML_TYPE_Q6_K) {
        return (n_in / QK_K) * n_columns * (int64_t) sizeof(column_superblock);
    }
    const int64_t nb = n_in / BLOCK;
    return nb * n_columns * (int64_t) sizeof(column_block) + nb * (int64_t) sizeof(block_lanes);
}

static TARGET void prepare_block(const struct ggml_tensor * x, int64_t c, int64_t ib, column_block * out,
                                 block_lanes * lanes) {
    const char * row = (const char *) x->data + c * x->nb[1];
    half_bits d;
    float sum = 0.0f;
    if (x->type == GGML_TYPE_Q8_1) {
        const block_q8_1_t * b = (const block_q8_1_t *) row + ib;
        memcpy(out->values, b->qs, BLOCK);
        d = b->d;
        sum = half_to_float(b->s);
    } else {
        const block_q8_0_t * b = (const block_q8_0_t *) row + ib;
        memcpy(out->values, b->qs, BLOCK);
        d = b->d;
    }
    lanes[ib].scale[c] = half_to_float(d);
    lanes[ib].sum[c] = sum;
    for (int64_t k = c + 1; c == x->ne[1] - 1 && k < ELELEM_SMALL_BATCH_MAX_COLUMNS; k++) {
        lanes[ib].scale[k] = lanes[ib].sum[k] = 0.0f;   /* the last column's clears the lanes past it */
    }
}

static void prepare_superblock(const struct ggml_tensor * x, int64_t c, int64_t ib, column_superblock * out) {
    const block_q8_K_t * b = (const block_q8_K_t *) ((const char *) x->data + c * x->nb[1]) + ib;
    memcpy(out->values, b->qs, sizeof out->values);
    memcpy(out->bsums, b->bsums, sizeof out->bsums);
    out->scale = b->d;
    memset(out->padding, 0, sizeof out->padding);
}

void elelem_small_batch_avx2_prepare(const struct ggml_tensor * x, int ith, int nth, void * out) {
    const int64_t n = x->ne[1];
    const int64_t nb = x->ne[0] / (x->type == GGML_TYPE_Q8_K ? QK_K : BLOCK), total = nb * n;
    block_lanes * lanes = x->type == GGML_TYPE_Q8_K ? NULL : lanes_of(out, nb, n);
    for (int64_t i = total * ith / nth; i < total * (ith + 1) / nth; i++) {
        const int64_t ib = i / n, c = i % n;   /* a block's columns side by side */
        if (x->type == GGML_TYPE_Q8_K) {
            prepare_superblock(x, c, ib, (column_superblock *) out + i);
        } else {
            prepare_block(x, c, ib, (column_block *) out + i, lanes);
        }
    }
}

/* Rows r0..r1 of the product for N columns.  UNPACK turns the weight block b
 * into qx, its 32 values as bytes: signed (SIGNED: ggml's mul_sum_i8_pairs,
 * which multiplies |qx| by the column's bytes carrying qx's signs) or, for
 * Q4_1, unsigned (mul_sum_us8_pairs, plus ggml's summs += m * s, which
 * MINS runs for all the columns at once: lane c is column c's summs, each
 * lane the same single-rounded fma as ggml's contracted scalar one). */
#define AVX2_KERNEL(NAME, BLOCK_T, UNPACK, SIGNED, MINS)                                                         \
static inline __attribute__((always_inline)) TARGET void NAME##_columns(                                \
        const int N, int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,            \
        const column_block * cb, float * out, size_t out_stride) {                                     \
    const __m256i ones = _mm256_set1_epi16(1);                                                         \
    const block_lanes * lanes = lanes_of(cb, nb, N);                                                    \
    for (int64_t r = r0; r < r1; r++) {                                                                 \
        const BLOCK_T * xb = (const BLOCK_T *) (w + r * w_stride);                                     \
        __m256 acc[8];                                                                                  \
        __m256 mins = _mm256_setzero_ps();                                                              \
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) acc[c] = _mm256_setzero_ps();               \
        for (int64_t ib = 0; ib < nb; ib++) {                                                           \
            const BLOCK_T * b = &xb[ib];                                                                \
            UNPACK;                                                                                     \
            const __m256i ax = SIGNED ? _mm256_sign_epi8(qx, qx) : qx;                                  \
            /* each column's d * the weight's, as ggml's scalar product: one vmulps for  \
             * all of them from 4 columns on (fewer pay more for the store it reads) */    \
            const __m256 dw = _mm256_set1_ps(half_to_float(b->d));                                      \
            float d[8];                                                                                 \
            if (N >= 4) _mm256_storeu_ps(d, _mm256_mul_ps(dw, _mm256_loadu_ps(lanes[ib].scale)));       \
            const column_block * y = &cb[ib * N];                                                       \
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {                                       \
                const __m256i yv = _mm256_loadu_si256((const __m256i *) y[c].values);                   \
                const __m256i sy = SIGNED ? _mm256_sign_epi8(yv, qx) : yv;                              \
                const __m256i products = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(ax, sy));         \
                acc[c] = _mm256_fmadd_ps(N >= 4 ? _mm256_broadcast_ss(&d[c]) : _mm256_mul_ps(dw, _mm256_broadcast_ss(&lanes[ib].scale[c])), _mm256_cvtepi32_ps(products), acc[c]); \
            }                                                                                           \
            MINS;                                                                                       \
        }                                                                                               \
        float min_terms[8];                                                                             \
        _mm256_storeu_ps(min_terms, mins);                                                              \
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {                                           \
            /* no "+ 0.0f" for the signed types: it would turn -0.0 into +0.0 */                         \
            out[c * out_stride + r] = SIGNED ? hsum8(acc[c]) : hsum8(acc[c]) + min_terms[c];            \
        }                                                                                               \
    }                                                                                                   \
}                                                                                                       \
static TARGET void NAME(int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,          \
                        const column_block * cb, int64_t n, float * out, size_t out_stride) {          \
    switch (n) {  /* a constant count of columns keeps the accumulators in registers */                \
        case 1: NAME##_columns(1, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        case 2: NAME##_columns(2, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        case 3: NAME##_columns(3, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        case 4: NAME##_columns(4, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        case 5: NAME##_columns(5, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        case 6: NAME##_columns(6, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        case 7: NAME##_columns(7, nb, w, w_stride, r0, r1, cb, out, out_stride); break;                \
        default: NAME##_columns(8, nb, w, w_stride, r0, r1, cb, out, out_stride); break;               \
    }                                                                                                   \
}

AVX2_KERNEL(rows_q8_0, block_q8_0_t, const __m256i qx = _mm256_loadu_si256((const __m256i *) b->qs), 1, (void) 0)
AVX2_KERNEL(rows_q5_0, block_q5_0_t, const __m256i qx = _mm256_or_si256(nibbles(b->qs), q5_high_bits(b->qh)), 1, (void) 0)
AVX2_KERNEL(rows_q4_0, block_q4_0_t, const __m256i qx = _mm256_sub_epi8(nibbles(b->qs), _mm256_set1_epi8(8)), 1, (void) 0)
AVX2_KERNEL(rows_q4_1, block_q4_1_t, const __m256i qx = nibbles(b->qs), 0,
            mins = _mm256_fmadd_ps(_mm256_set1_ps(half_to_float(b->m)),
                                   _mm256_loadu_ps(lanes[ib].sum), mins))

/* Q6_K: per super-block and column, ggml's eight maddubs and madds by the
 * scales into eight int32 lanes, minus 32 * (the column's 16-value sums
 * times the scales), then one fma with d = d_column * d_weight. */
static inline __attribute__((always_inline)) TARGET void rows_q6_k_columns(
        const int N, int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,
        const column_superblock * cb, float * out, size_t out_stride) {
    for (int64_t r = r0; r < r1; r++) {
        const block_q6_K_t * xb = (const block_q6_K_t *) (w + r * w_stride);
        __m256 acc[8];
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t ib = 0; ib < nb; ib++) {
            const block_q6_K_t * b = &xb[ib];
            const column_superblock * y = &cb[ib * N];
            __m256i q[8];
            unpack_q6(b, q);
            __m256i sums[8];
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) sums[c] = _mm256_setzero_si256();
            for (int v = 0; v < 8; v++) {
                const __m256i scales = q6_vector_scales(b->scales, v);
                _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                    const __m256i products = _mm256_maddubs_epi16(q[v], _mm256_loadu_si256((const __m256i *) (y[c].values + 32 * v)));
                    sums[c] = _mm256_add_epi32(sums[c], _mm256_madd_epi16(scales, products));
                }
            }
            const __m256i all_scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) b->scales));
            const float dw = half_to_float(b->d);
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *) y[c].bsums), all_scales), 5);
                const __m256i lanes = _mm256_sub_epi32(sums[c], offset);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(y[c].scale * dw), _mm256_cvtepi32_ps(lanes), acc[c]);
            }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) out[c * out_stride + r] = hsum8(acc[c]);
    }
}

static TARGET void rows_q6_k(int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,
                             const column_superblock * cb, int64_t n, float * out, size_t out_stride) {
    switch (n) {
        case 1: rows_q6_k_columns(1, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        case 2: rows_q6_k_columns(2, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        case 3: rows_q6_k_columns(3, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        case 4: rows_q6_k_columns(4, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        case 5: rows_q6_k_columns(5, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        case 6: rows_q6_k_columns(6, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        case 7: rows_q6_k_columns(7, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
        default: rows_q6_k_columns(8, nb, w, w_stride, r0, r1, cb, out, out_stride); break;
    }
}

void elelem_small_batch_avx2_matmul(struct ggml_tensor * dst, int ith, int nth) {
    const struct ggml_tensor * w = dst->src[0];
    const void * prepared = dst->src[1]->data;
    const int64_t m = w->ne[1], n = dst->ne[1];
    const int64_t r0 = m * ith / nth, r1 = m * (ith + 1) / nth;
    const char * wd = (const char *) w->data;
    float * out = (float *) dst->data;
    const size_t out_stride = dst->nb[1] / sizeof(float);
    const int64_t nb = w->ne[0] / BLOCK;
    if (r0 >= r1) {
        return;
    }
    switch (w->type) {
        case GGML_TYPE_Q8_0: rows_q8_0(nb, wd, w->nb[1], r0, r1, prepared, n, out, out_stride); break;
        case GGML_TYPE_Q5_0: rows_q5_0(nb, wd, w->nb[1], r0, r1, prepared, n, out, out_stride); break;
        case GGML_TYPE_Q4_0: rows_q4_0(nb, wd, w->nb[1], r0, r1, prepared, n, out, out_stride); break;
        case GGML_TYPE_Q4_1: rows_q4_1(nb, wd, w->nb[1], r0, r1, prepared, n, out, out_stride); break;
        case GGML_TYPE_Q6_K: rows_q6_k(w->ne[0] / QK_K, wd, w->nb[1], r0, r1, prepared, n, out, out_stride); break;
        default: break;  /* the graph builder asks elelem_small_batch_serves() first */
    }
}
