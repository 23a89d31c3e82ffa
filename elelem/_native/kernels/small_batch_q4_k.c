/* Steps of 2 to 8 generated tokens through Q4_K weights that ggml's CPU
 * backend repacked (its CPU_REPACK buffer on x86 with AVX2: block_q4_Kx8,
 * eight rows' super-blocks interleaved).
 *
 * ggml multiplies such a weight by one column with its
 * ggml_gemv_q4_K_8x8_q8_K, whose x86 code is AVX2 (with AVX-512 too); a step
 * of N tokens ran that once per column (graph/blocks.pxi), unpacking every
 * block N times.  A one-token step runs this kernel too, for its read-ahead
 * (PREFETCH_BLOCKS).  This kernel unpacks each block once for all the columns
 * and gives each column, bit for bit, what that gemv gives it:
 * - the same unsigned-nibble x signed-byte maddubs, summed in int16 lanes
 *   (wrapping adds, so their order cannot change the sum), times the
 *   sub-blocks' 6-bit scales by madd into int32 lanes, the rows in the
 *   gemv's lane order (0 4 1 5 2 6 3 7);
 * - the mins as madd of the column's sub-block sums (pairs of its Q8_K
 *   bsums, hadd) by the rows' 6-bit mins, rows in order;
 * - per super-block the same two fma, by d_weight * d_column and
 *   dmin_weight * d_column; at the end the same permute and subtraction.
 * The columns are the CPU backend's own Q8_K quantization of them (a
 * ggml_cpy, as its mul_mat quantizes them), read as they lie. */
#include "experts.h"
#include "small_batch.h"
#include "simd.h"

#define TARGET SMALL_BATCH_AVX2_TARGET
#define ROWS 8   /* rows interleaved in a block_q4_Kx8 */
/* The weight is asked for two interleaved blocks (2 x 1152 bytes) ahead of
 * the one multiplied: the hardware prefetcher alone left a one-token step
 * short of what a core streams (Sapphire Rapids, 2 threads, the Qwen3.5-4B
 * shape's decode: +10% against ggml's gemv; 1 and 3 blocks ahead +4%, 4
 * +6%).  A prefetch past the weight's end is harmless (a hint, never a
 * fault). */
#define PREFETCH_BLOCKS 2

typedef struct {
    half_bits d[ROWS];
    half_bits dmin[ROWS];
    uint8_t scales[96];      /* per sub-block pair: 12 bytes for the first, 12 for the second */
    uint8_t qs[QK_K * ROWS / 2];
} block_q4_Kx8_t;

/* One sub-block's 6-bit scales (bytes 0-7, one a row) and mins (bytes 8-15)
 * from its 12 packed bytes: the low 6 bits of bytes 0-3 and 4-7 are rows
 * 0-3's scales and mins, and rows 4-7 take bytes 8-11's nibbles plus the
 * top 2 bits of bytes 0-7. */
static inline __m128i scales_and_mins(const uint8_t * packed) {
    uint32_t u[3];
    memcpy(u, packed, sizeof u);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t scales_0_3 = u[0] & low6, mins_0_3 = u[1] & low6;
    const uint32_t scales_4_7 = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
    const uint32_t mins_4_7 = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
    return _mm_set_epi32((int) mins_4_7, (int) mins_0_3, (int) scales_4_7, (int) scales_0_3);
}

static inline int32_t load32(const int8_t * p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Ask for the weight PREFETCH_BLOCKS interleaved blocks ahead of b. */
static inline __attribute__((always_inline)) TARGET void prefetch_ahead(const block_q4_Kx8_t * b) {
    for (int line = 0; line < (int) sizeof(block_q4_Kx8_t); line += 64) {
        _mm_prefetch((const char *) (b + PREFETCH_BLOCKS) + line, _MM_HINT_T0);
    }
}

/* A column's 8 sub-block sums (pairs of its Q8_K bsums), two int16 a sub-block pair. */
static inline __attribute__((always_inline)) TARGET void pair_sums_of(const block_q8_K_t * column, int32_t out[4]) {
    const __m128i bsums_0_7 = _mm_loadu_si128((const __m128i *) column->bsums);
    const __m128i bsums_8_15 = _mm_loadu_si128((const __m128i *) (column->bsums + 8));
    _mm_storeu_si128((__m128i *) out, _mm_hadd_epi16(bsums_0_7, bsums_8_15));
}

static inline __attribute__((always_inline)) TARGET void q4_k_groups(
        const int N, int64_t nb, const block_q4_Kx8_t * w, int64_t g0, int64_t g1,
        const block_q8_K_t * const * columns, float * out, size_t out_stride) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    /* the rows' scales in the int32 lanes' order, twice each (two int16 a lane) */
    const __m128i scale_order = _mm_set_epi8(7, 7, 3, 3, 6, 6, 2, 2, 5, 5, 1, 1, 4, 4, 0, 0);
    /* d of rows 0 4 1 5 2 6 3 7, the lanes' order */
    const __m128i d_order = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m256i row_order = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
    for (int64_t g = g0; g < g1; g++) {
        const block_q4_Kx8_t * wg = w + g * nb;
        __m256 acc[8], acc_min[8];
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
            acc[c] = _mm256_setzero_ps();
            acc_min[c] = _mm256_setzero_ps();
        }
        for (int64_t ib = 0; ib < nb; ib++) {
            const block_q4_Kx8_t * b = &wg[ib];
            prefetch_ahead(b);
            __m256i sums[8], min_sums[8];
            int32_t pair_sums[8][4];   /* a column's sub-block sums, two int16 a sub-block pair */
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                sums[c] = min_sums[c] = _mm256_setzero_si256();
                pair_sums_of(&columns[c][ib], pair_sums[c]);
            }
            for (int sb = 0; sb < 4; sb++) {   /* sub-blocks 2 sb (low nibbles) and 2 sb + 1 (high) */
                const __m128i first = scales_and_mins(b->scales + 24 * sb);
                const __m128i second = scales_and_mins(b->scales + 24 * sb + 12);
                const __m256i scales[2] = {_mm256_cvtepu8_epi16(_mm_shuffle_epi8(first, scale_order)),
                                           _mm256_cvtepu8_epi16(_mm_shuffle_epi8(second, scale_order))};
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(first, second));
                for (int half = 0; half < 2; half++) {
                    __m256i part[8];
                    _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) part[c] = _mm256_setzero_si256();
                    for (int k = 0; k < 4; k++) {
                        __m256i rows_0_3 = _mm256_loadu_si256((const __m256i *) (b->qs + sb * 256 + 64 * k));
                        __m256i rows_4_7 = _mm256_loadu_si256((const __m256i *) (b->qs + sb * 256 + 64 * k + 32));
                        if (half) {
                            rows_0_3 = _mm256_srli_epi16(rows_0_3, 4);
                            rows_4_7 = _mm256_srli_epi16(rows_4_7, 4);
                        }
                        rows_0_3 = _mm256_and_si256(rows_0_3, m4);
                        rows_4_7 = _mm256_and_si256(rows_4_7, m4);
                        /* 4 bytes of each row a lane, rows 0 4 1 5 2 6 3 7: values 8k..8k+3, then 8k+4..8k+7 */
                        const __m256i even = _mm256_blend_epi32(rows_0_3, _mm256_shuffle_epi32(rows_4_7, 177), 170);
                        const __m256i odd = _mm256_blend_epi32(_mm256_shuffle_epi32(rows_0_3, 177), rows_4_7, 170);
                        const int64_t at = sb * 64 + half * 32 + 8 * k;
                        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                            const int8_t * q = columns[c][ib].qs + at;
                            part[c] = _mm256_add_epi16(part[c], _mm256_maddubs_epi16(even, _mm256_set1_epi32(load32(q))));
                            part[c] = _mm256_add_epi16(part[c], _mm256_maddubs_epi16(odd, _mm256_set1_epi32(load32(q + 4))));
                        }
                    }
                    _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                        sums[c] = _mm256_add_epi32(sums[c], _mm256_madd_epi16(part[c], scales[half]));
                    }
                }
                _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                    min_sums[c] = _mm256_add_epi32(min_sums[c], _mm256_madd_epi16(_mm256_set1_epi32(pair_sums[c][sb]), mins));
                }
            }
            const __m256 d = _mm256_cvtph_ps(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *) b->d), d_order));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->dmin));
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                const __m256 dc = _mm256_set1_ps(columns[c][ib].d);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[c]), _mm256_mul_ps(d, dc), acc[c]);
                acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sums[c]), _mm256_mul_ps(dmin, dc), acc_min[c]);
            }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
            _mm256_storeu_ps(out + c * out_stride + g * ROWS,
                             _mm256_sub_ps(_mm256_permutevar8x32_ps(acc[c], row_order), acc_min[c]));
        }
    }
}

/* The same numbers with AVX-512 VNNI, where a zmm holds all 8 rows: int32
 * lanes 2r and 2r + 1 take row r's bytes as block_q4_Kx8 lays them out
 * (values 8k..8k+3 and 8k+4..8k+7 of a sub-block), and vpdpbusd multiplies
 * them with the column's 8 bytes broadcast to every 64-bit lane, summing
 * four products a lane.  Every integer above is an exact sum, in any order
 * (no lane saturates: a sub-block's 32 products of 4-bit and 8-bit values
 * times a 6-bit scale stay far inside int32), so row r's super-block sum,
 * lanes 2r + 2r + 1, is the gemv's; the floats then take the gemv's very
 * operations, in 16 lanes (each row twice) where it has 8.  Half the
 * instructions of the AVX2 loop: one multiply-add of 64 bytes for two
 * maddubs and two adds of 32. */
static inline __attribute__((always_inline)) SMALL_BATCH_AVX512_TARGET void q4_k_groups_vnni(
        const int N, int64_t nb, const block_q4_Kx8_t * w, int64_t g0, int64_t g1,
        const block_q8_K_t * const * columns, float * out, size_t out_stride) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m128i row_twice = _mm_set_epi8(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i lane_row = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i even_lanes = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int64_t g = g0; g < g1; g++) {
        const block_q4_Kx8_t * wg = w + g * nb;
        __m512 acc[8];
        __m256 acc_min[8];
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
            acc[c] = _mm512_setzero_ps();
            acc_min[c] = _mm256_setzero_ps();
        }
        for (int64_t ib = 0; ib < nb; ib++) {
            const block_q4_Kx8_t * b = &wg[ib];
            prefetch_ahead(b);
            __m512i sums[8];
            __m256i min_sums[8];
            int32_t pair_sums[8][4];
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                sums[c] = _mm512_setzero_si512();
                min_sums[c] = _mm256_setzero_si256();
                pair_sums_of(&columns[c][ib], pair_sums[c]);
            }
            for (int sb = 0; sb < 4; sb++) {
                const __m128i first = scales_and_mins(b->scales + 24 * sb);
                const __m128i second = scales_and_mins(b->scales + 24 * sb + 12);
                const __m512i scales[2] = {_mm512_cvtepu8_epi32(_mm_shuffle_epi8(first, row_twice)),
                                           _mm512_cvtepu8_epi32(_mm_shuffle_epi8(second, row_twice))};
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(first, second));
                __m512i packed[4];
                for (int k = 0; k < 4; k++) {
                    packed[k] = _mm512_loadu_si512((const void *) (b->qs + sb * 256 + 64 * k));
                }
                for (int half = 0; half < 2; half++) {
                    __m512i values[4];
                    for (int k = 0; k < 4; k++) {
                        values[k] = _mm512_and_si512(half ? _mm512_srli_epi16(packed[k], 4) : packed[k], m4);
                    }
                    _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                        const int8_t * q = columns[c][ib].qs + sb * 64 + half * 32;
                        __m512i dot = _mm512_setzero_si512();
                        for (int k = 0; k < 4; k++) {
                            int64_t bytes;
                            memcpy(&bytes, q + 8 * k, sizeof bytes);
                            dot = _mm512_dpbusd_epi32(dot, values[k], _mm512_set1_epi64(bytes));
                        }
                        sums[c] = _mm512_add_epi32(sums[c], _mm512_mullo_epi32(dot, scales[half]));
                    }
                }
                _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                    min_sums[c] = _mm256_add_epi32(min_sums[c], _mm256_madd_epi16(_mm256_set1_epi32(pair_sums[c][sb]), mins));
                }
            }
            const __m512 d = _mm512_permutexvar_ps(lane_row, _mm512_castps256_ps512(
                _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->d))));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) b->dmin));
            _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
                const __m512i row_sums = _mm512_add_epi32(sums[c], _mm512_shuffle_epi32(sums[c], _MM_PERM_CDAB));
                acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(row_sums), _mm512_mul_ps(d, _mm512_set1_ps(columns[c][ib].d)), acc[c]);
                acc_min[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(min_sums[c]),
                                             _mm256_mul_ps(dmin, _mm256_set1_ps(columns[c][ib].d)), acc_min[c]);
            }
        }
        _Pragma("GCC unroll 8") for (int c = 0; c < N; c++) {
            const __m256 rows = _mm512_castps512_ps256(_mm512_permutexvar_ps(even_lanes, acc[c]));
            _mm256_storeu_ps(out + c * out_stride + g * ROWS, _mm256_sub_ps(rows, acc_min[c]));
        }
    }
}

/* Rows [8 g0, 8 g1) of a block_q4_Kx8 weight of nb super-blocks a row,
 * times n (1 to 8) Q8_K columns: out[c * out_stride + row]. */
/* A constant count of columns keeps the accumulators in registers. */
#define BY_COLUMN_COUNT(kernel, n, ...) do { switch (n) { \
    case 1: kernel(1, __VA_ARGS__); break; case 2: kernel(2, __VA_ARGS__); break; \
    case 3: kernel(3, __VA_ARGS__); break; case 4: kernel(4, __VA_ARGS__); break; \
    case 5: kernel(5, __VA_ARGS__); break; case 6: kernel(6, __VA_ARGS__); break; \
    case 7: kernel(7, __VA_ARGS__); break; default: kernel(8, __VA_ARGS__); break; } } while (0)

static TARGET void rows_avx2(int n, int64_t nb, const block_q4_Kx8_t * w, int64_t g0, int64_t g1,
                             const block_q8_K_t * const * x, float * out, size_t out_stride) {
    BY_COLUMN_COUNT(q4_k_groups, n, nb, w, g0, g1, x, out, out_stride);
}

static SMALL_BATCH_AVX512_TARGET void rows_avx512(int n, int64_t nb, const block_q4_Kx8_t * w, int64_t g0, int64_t g1,
                                                  const block_q8_K_t * const * x, float * out, size_t out_stride) {
    BY_COLUMN_COUNT(q4_k_groups_vnni, n, nb, w, g0, g1, x, out, out_stride);
}

void elelem_small_batch_q4_k_rows(int isa, int n, int64_t nb, const void * weight, int64_t g0, int64_t g1,
                                  const void * const * columns, float * out, size_t out_stride) {
    const block_q4_Kx8_t * w = (const block_q4_Kx8_t *) weight;
    const block_q8_K_t * const * x = (const block_q8_K_t * const *) columns;
    if (isa == ELELEM_SMALL_BATCH_AVX512) {
        rows_avx512(n, nb, w, g0, g1, x, out, out_stride);
    } else {
        rows_avx2(n, nb, w, g0, g1, x, out, out_stride);
    }
}

static void q4_k_matmul(int isa, struct ggml_tensor * dst, int ith, int nth, const struct ggml_tensor * w) {
    const struct ggml_tensor * x = dst->src[0];
    const int64_t groups = w->ne[1] / ROWS, nb = w->ne[0] / QK_K;
    const void * columns[ELELEM_SMALL_BATCH_MAX_COLUMNS];
    for (int64_t c = 0; c < x->ne[1]; c++) {
        columns[c] = (const char *) x->data + c * x->nb[1];
    }
    elelem_small_batch_q4_k_rows(isa, (int) x->ne[1], nb, w->data, groups * ith / nth, groups * (ith + 1) / nth,
                                 columns, (float *) dst->data, dst->nb[1] / sizeof(float));
}

/* More than 8 columns: groups of 8, each a product of its own (as small_batch.c's). */
static void q4_k_matmul_columns(int isa, struct ggml_tensor * dst, int ith, int nth, void * weight) {
    const struct ggml_tensor * x = dst->src[0];
    for (int64_t c = 0; c < x->ne[1]; c += ELELEM_SMALL_BATCH_MAX_COLUMNS) {
        struct ggml_tensor columns = *x, out = *dst;
        columns.ne[1] = x->ne[1] - c < ELELEM_SMALL_BATCH_MAX_COLUMNS ? x->ne[1] - c : ELELEM_SMALL_BATCH_MAX_COLUMNS;
        columns.data = (char *) x->data + c * x->nb[1];
        out.src[0] = &columns;
        out.ne[1] = columns.ne[1];
        out.data = (char *) dst->data + c * dst->nb[1];
        q4_k_matmul(isa, &out, ith, nth, (const struct ggml_tensor *) weight);
    }
}

void elelem_small_batch_q4_k_matmul(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    q4_k_matmul_columns(ELELEM_SMALL_BATCH_AVX2, dst, ith, nth, weight);
}

void elelem_small_batch_q4_k_matmul_avx512(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    q4_k_matmul_columns(ELELEM_SMALL_BATCH_AVX512, dst, ith, nth, weight);
}
