/* The small-batch kernel for Q6_K weights (against Q8_K columns).
 *
 * ggml's AVX2 ggml_vec_dot_q6_K_q8_K, per 256-value super-block: eight
 * 32-byte vectors of 6-bit values (0..63), each multiplied with the column's
 * bytes by maddubs (int16 pairs) and by its two 16-value scales by madd
 * (int32 lanes), all summed into eight int32 lanes; minus 32 * (the column's
 * 16-value sums times the scales), for the values' offset of 32; converted to
 * float and accumulated by fma with d = d_column * d_weight; at the end
 * hsum8.  Here each zmm carries two columns, so each half does exactly that
 * (vpdpwssd is madd and add in one, on the same exact integers), while the
 * weight's values and scales are unpacked once for every column. */
#include "small_batch_avx512_q6_k.h"
#include "simd.h"

/* One super-block of a pair of columns, as the matmul reads it. */
typedef struct {
    int8_t values[8][64];     /* vector v of both columns: the first's 32 bytes, then the second's */
    int16_t bsums[32];        /* the first column's 16 sums of 16 values, then the second's */
    float scale[16];          /* the first column's d in lanes 0-7, the second's in 8-15 */
} pair_superblock;

int64_t elelem_small_batch_q6_k_prepared_bytes(int64_t n_in, int64_t n_columns) {
    return (n_in / QK_K) * ((n_columns + 1) / 2) * (int64_t) sizeof(pair_superblock);
}

/* Super-block ib of a pair of Q8_K columns (b may be a: an odd count's last pair). */
static void prepare_pair(const block_q8_K_t * a, const block_q8_K_t * b, pair_superblock * o) {
    for (int v = 0; v < 8; v++) {
        memcpy(o->values[v], a->qs + 32 * v, 32);
        memcpy(o->values[v] + 32, b->qs + 32 * v, 32);
    }
    memcpy(o->bsums, a->bsums, sizeof a->bsums);
    memcpy(o->bsums + 16, b->bsums, sizeof b->bsums);
    for (int l = 0; l < 8; l++) {
        o->scale[l] = a->d;
        o->scale[8 + l] = b->d;
    }
}

void elelem_small_batch_q6_k_prepare(const struct ggml_tensor * x, int ith, int nth, void * out_data) {
    const int64_t n = x->ne[1], nb = x->ne[0] / QK_K, pairs = (n + 1) / 2, total = nb * pairs;
    pair_superblock * out = (pair_superblock *) out_data;
    for (int64_t i = total * ith / nth; i < total * (ith + 1) / nth; i++) {
        const int64_t ib = i / pairs, p = i % pairs;
        const int64_t c0 = 2 * p, c1 = 2 * p + 1 < n ? 2 * p + 1 : 2 * p;
        prepare_pair((const block_q8_K_t *) ((const char *) x->data + c0 * x->nb[1]) + ib,
                     (const block_q8_K_t *) ((const char *) x->data + c1 * x->nb[1]) + ib, &out[ib * pairs + p]);
    }
}

void elelem_small_batch_q6_k_prepare_columns(const void * const * columns, int64_t n, int64_t nb, void * out_data) {
    const int64_t pairs = (n + 1) / 2;
    pair_superblock * out = (pair_superblock *) out_data;
    for (int64_t ib = 0; ib < nb; ib++) {
        for (int64_t p = 0; p < pairs; p++) {
            const int64_t c1 = 2 * p + 1 < n ? 2 * p + 1 : 2 * p;
            prepare_pair((const block_q8_K_t *) columns[2 * p] + ib, (const block_q8_K_t *) columns[c1] + ib,
                         &out[ib * pairs + p]);
        }
    }
}

static inline __attribute__((always_inline)) SMALL_BATCH_AVX512_TARGET void rows_q6_k_pairs(
        const int NP, int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,
        const pair_superblock * pb, int64_t n, float * out, size_t out_stride) {
    for (int64_t r = r0; r < r1; r++) {
        const block_q6_K_t * xb = (const block_q6_K_t *) (w + r * w_stride);
        __m512 acc[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) acc[p] = _mm512_setzero_ps();
        for (int64_t ib = 0; ib < nb; ib++) {
            const block_q6_K_t * b = &xb[ib];
            const pair_superblock * y = &pb[ib * NP];
            __m256i q[8];
            unpack_q6(b, q);
            __m512i sums[4];
            _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) sums[p] = _mm512_setzero_si512();
            for (int v = 0; v < 8; v++) {
                const __m512i values = _mm512_broadcast_i64x4(q[v]);
                const __m512i scales = _mm512_broadcast_i64x4(q6_vector_scales(b->scales, v));
                _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {
                    const __m512i products = _mm512_maddubs_epi16(values, _mm512_loadu_si512(y[p].values[v]));
                    sums[p] = _mm512_dpwssd_epi32(sums[p], products, scales);
                }
            }
            const __m512i all_scales = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) b->scales)));
            const __m512 dw = _mm512_set1_ps(half_to_float(b->d));
            _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {
                const __m512i offset = _mm512_slli_epi32(_mm512_madd_epi16(_mm512_loadu_si512(y[p].bsums), all_scales), 5);
                const __m512i lanes = _mm512_sub_epi32(sums[p], offset);
                acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(y[p].scale), dw), _mm512_cvtepi32_ps(lanes), acc[p]);
            }
        }
        _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {
            out[(2 * p) * out_stride + r] = hsum8(_mm512_castps512_ps256(acc[p]));
            if (2 * p + 1 < n) out[(2 * p + 1) * out_stride + r] = hsum8(_mm512_extractf32x8_ps(acc[p], 1));
        }
    }
}

/* Two rows' 32 bytes, side by side in a zmm. */
static inline __attribute__((always_inline)) SMALL_BATCH_AVX512_TARGET __m512i two_rows(const void * a, const void * b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *) a)),
                              _mm256_loadu_si256((const __m256i *) b), 1);
}

/* How far ahead of the block being multiplied each row's bytes are asked
 * for: the hardware prefetcher alone left a one-token step's weight reads
 * short of what a core streams (Sapphire Rapids, 2 threads: with
 * small_batch_q4_k.c's read-ahead, the Qwen3.5-4B shape's decode went from
 * 13.5-13.7 to 15.8-16.0 tok/s; with AMX, where only Q6_K's is used,
 * +4-6%).  A prefetch past the weight's end is harmless (a hint). */
#define PREFETCH_BYTES 1024

/* One column (a one-token step): two rows a zmm, the column in both halves,
 * so that each half does for its row exactly what ggml's AVX2
 * ggml_vec_dot_q6_K_q8_K does (rows_q6_k_pairs' comment), with none of the
 * zmm spent on a second copy of the column.  The column is the first of
 * its prepared pairs. */
static SMALL_BATCH_AVX512_TARGET void rows_q6_k_one_column(int64_t nb, const char * w, size_t w_stride, int64_t r0,
                                                            int64_t r1, const pair_superblock * pb, float * out) {
    const __m512i m3 = _mm512_set1_epi8(3), m15 = _mm512_set1_epi8(15), m12 = _mm512_set1_epi8(12);
    const __m512i m48 = _mm512_set1_epi8(48), m192 = _mm512_set1_epi8(-64);
    /* vector v's scales, 2v for its first 16 values and 2v + 1 for the next, in
     * int16 lanes; the second row's 16 scales are lanes 16-31 of both_scales */
    __m512i scale_index[8];
    for (int v = 0; v < 8; v++) {
        int16_t index[32];
        for (int l = 0; l < 32; l++) index[l] = (int16_t) ((l >= 16 ? 16 : 0) + 2 * v + ((l & 15) >= 8));
        scale_index[v] = _mm512_loadu_si512(index);
    }
    for (int64_t r = r0; r < r1; r += 2) {
        const block_q6_K_t * xa = (const block_q6_K_t *) (w + r * w_stride);
        const block_q6_K_t * xb = r + 1 < r1 ? (const block_q6_K_t *) (w + (r + 1) * w_stride) : xa;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t ib = 0; ib < nb; ib++) {
            const block_q6_K_t * a = &xa[ib], * b = &xb[ib];
            const pair_superblock * y = &pb[ib];
            for (int line = 0; line < (int) sizeof(block_q6_K_t); line += 64) {
                _mm_prefetch((const char *) a + PREFETCH_BYTES + line, _MM_HINT_T0);
                _mm_prefetch((const char *) b + PREFETCH_BYTES + line, _MM_HINT_T0);
            }
            const __m512i both_scales = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) a->scales))),
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *) b->scales)), 1);
            __m512i sums = _mm512_setzero_si512();
            for (int j = 0; j < 2; j++) {   /* unpack_q6, two rows at once */
                const __m512i bits1 = two_rows(a->ql + 64 * j, b->ql + 64 * j);
                const __m512i bits2 = two_rows(a->ql + 64 * j + 32, b->ql + 64 * j + 32);
                const __m512i high = two_rows(a->qh + 32 * j, b->qh + 32 * j);
                __m512i q[4];
                q[0] = _mm512_or_si512(_mm512_and_si512(bits1, m15), _mm512_slli_epi16(_mm512_and_si512(high, m3), 4));
                q[1] = _mm512_or_si512(_mm512_and_si512(bits2, m15), _mm512_slli_epi16(_mm512_and_si512(high, m12), 2));
                q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bits1, 4), m15), _mm512_and_si512(high, m48));
                q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bits2, 4), m15),
                                       _mm512_srli_epi16(_mm512_and_si512(high, m192), 2));
                for (int k = 0; k < 4; k++) {
                    const int v = 4 * j + k;
                    const __m512i column = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) y->values[v]));
                    const __m512i products = _mm512_maddubs_epi16(q[k], column);
                    sums = _mm512_dpwssd_epi32(sums, products, _mm512_permutexvar_epi16(scale_index[v], both_scales));
                }
            }
            const __m512i bsums = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *) y->bsums));
            const __m512i offset = _mm512_slli_epi32(_mm512_madd_epi16(bsums, both_scales), 5);
            const __m512 d = _mm512_insertf32x8(_mm512_set1_ps(y->scale[0] * half_to_float(a->d)),
                                                _mm256_set1_ps(y->scale[0] * half_to_float(b->d)), 1);
            acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(sums, offset)), acc);
        }
        out[r] = hsum8(_mm512_castps512_ps256(acc));
        if (r + 1 < r1) out[r + 1] = hsum8(_mm512_extractf32x8_ps(acc, 1));
    }
}

SMALL_BATCH_AVX512_TARGET void elelem_small_batch_q6_k_rows(int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,
                                  const void * prepared, int64_t n, float * out, size_t out_stride) {
    const pair_superblock * pb = (const pair_superblock *) prepared;
    if (n == 1) {
        rows_q6_k_one_column(nb, w, w_stride, r0, r1, pb, out);
        return;
    }
    switch ((n + 1) / 2) {  /* a constant count of pairs keeps the accumulators in registers */
        case 1: rows_q6_k_pairs(1, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;
        case 2: rows_q6_k_pairs(2, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;
        case 3: rows_q6_k_pairs(3, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;
        default: rows_q6_k_pairs(4, nb, w, w_stride, r0, r1, pb, n, out, out_stride); break;
    }
}
