/* The chosen experts' products in a step of generated tokens (experts.h).
 *
 * ggml's CPU mul_mat_id runs each (token, chosen expert) pair as a product
 * of its own: one column through the expert's gemv (repacked Q4_K) or
 * vec_dot (Q6_K), so an expert chosen by k of the step's tokens has its
 * weight read k times, and 8 streams read nearly 8 times the bytes one does.
 * Here the pairs are sorted by expert, and each expert's rows are read once
 * for all its columns (up to 8 at a time) by elelem's small-batch kernels,
 * which give each column, bit for bit, the number ggml's one-column kernel
 * gives it: so a token's outputs are those of its own one-token step.
 *
 * Work is split as (expert, group of up to 8 columns, 64 rows) items, in
 * expert order, a contiguous range of items per thread; each output number
 * is made by one thread, whatever the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "experts.h"
#include "small_batch.h"
#include "small_batch_avx512_q6_k.h"
#include "simd.h"

#define COLUMNS ELELEM_SMALL_BATCH_MAX_COLUMNS
#define CHUNK_ROWS 64          /* rows of an expert one work item computes: a multiple of 8 (block_q4_Kx8) */
#define Q4_K_BLOCK_BYTES 144   /* sizeof(block_q4_K); block_q4_Kx8 is 8 of them, interleaved */

typedef struct {
    int32_t expert;
    int32_t first;             /* its columns are pairs[first .. first + count) */
    int32_t count;
} column_group;

/* The step's (slot, token) pairs sorted by the expert they chose, in token
 * then slot order within an expert, cut into groups of at most COLUMNS.
 * Returns the number of groups, or -1 without memory. */
static int64_t sort_pairs(const struct ggml_tensor * ids, int64_t n_expert, int32_t * pairs, column_group * groups) {
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1];
    int32_t * start = (int32_t *) calloc((size_t) n_expert + 1, sizeof(int32_t));
    if (start == NULL) {
        return -1;
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        const int32_t * row = (const int32_t *) ((const char *) ids->data + t * ids->nb[1]);
        for (int64_t s = 0; s < n_used; s++) {
            if (row[s] >= 0 && row[s] < n_expert) {
                start[row[s] + 1]++;
            }
        }
    }
    for (int64_t e = 0; e < n_expert; e++) {
        start[e + 1] += start[e];
    }
    int64_t n_groups = 0;
    for (int64_t e = 0; e < n_expert; e++) {
        for (int32_t first = start[e]; first < start[e + 1]; first += COLUMNS) {
            const int32_t left = start[e + 1] - first;
            groups[n_groups++] = (column_group) {(int32_t) e, first, left < COLUMNS ? left : COLUMNS};
        }
    }
    for (int64_t t = 0; t < n_tokens; t++) {
        const int32_t * row = (const int32_t *) ((const char *) ids->data + t * ids->nb[1]);
        for (int64_t s = 0; s < n_used; s++) {
            if (row[s] >= 0 && row[s] < n_expert) {
                pairs[start[row[s]]++] = (int32_t) (t * n_used + s);
            }
        }
    }
    free(start);
    return n_groups;
}

static void experts_matmul(int isa, struct ggml_tensor * dst, int ith, int nth, void * weight) {
    const struct ggml_tensor * w = (const struct ggml_tensor *) weight;
    const struct ggml_tensor * x = dst->src[0];     /* Q8_K columns: one a token, or one a (token, slot) */
    const struct ggml_tensor * ids = dst->src[1];   /* I32 (n_used, n_tokens) */
    const int64_t n_used = ids->ne[0], n_tokens = ids->ne[1], n_pairs = n_used * n_tokens;
    const int64_t n_out = w->ne[1], n_expert = w->ne[2], nb = w->ne[0] / QK_K;
    const int column_a_slot = x->ne[1] == n_pairs;
    const int64_t chunks = (n_out + CHUNK_ROWS - 1) / CHUNK_ROWS;
    const int q6_k = w->type == GGML_TYPE_Q6_K;

    int32_t * pairs = (int32_t *) malloc((size_t) n_pairs * sizeof(int32_t));
    column_group * groups = (column_group *) malloc((size_t) n_pairs * sizeof(column_group));
    void * prepared = q6_k ? malloc((size_t) elelem_small_batch_q6_k_prepared_bytes(w->ne[0], COLUMNS)) : NULL;
    const int64_t n_groups = pairs && groups && (prepared || !q6_k) ? sort_pairs(ids, n_expert, pairs, groups) : -1;
    if (n_groups < 0) {
        /* Without memory no product can be made: NaN, never stale numbers. */
        for (int64_t i = 0; i < n_pairs && ith == 0; i++) {
            for (int64_t r = 0; r < n_out; r++) {
                *(float *) ((char *) dst->data + r * dst->nb[0] + (i % n_used) * dst->nb[1] + (i / n_used) * dst->nb[2]) = NAN;
            }
        }
        free(pairs); free(groups); free(prepared);
        return;
    }

    const int64_t n_items = n_groups * chunks;
    const void * columns[COLUMNS];
    float out[COLUMNS * CHUNK_ROWS];
    int64_t prepared_group = -1;
    for (int64_t item = n_items * ith / nth; item < n_items * (ith + 1) / nth; item++) {
        const column_group * g = &groups[item / chunks];
        const int64_t r0 = (item % chunks) * CHUNK_ROWS;
        const int64_t rows = n_out - r0 < CHUNK_ROWS ? n_out - r0 : CHUNK_ROWS;
        for (int32_t c = 0; c < g->count; c++) {
            const int32_t pair = pairs[g->first + c];
            columns[c] = (const char *) x->data + (column_a_slot ? pair : pair / n_used) * x->nb[1];
        }
        const char * expert = (const char *) w->data + g->expert * w->nb[2];
        if (q6_k) {
            if (prepared_group != item / chunks) {
                elelem_small_batch_q6_k_prepare_columns(columns, g->count, nb, prepared);
                prepared_group = item / chunks;
            }
            elelem_small_batch_q6_k_rows(nb, expert + r0 * w->nb[1], w->nb[1], 0, rows, prepared, g->count,
                                         out, CHUNK_ROWS);
        } else {
            /* block_q4_Kx8: rows 8 g .. 8 g + 7 are nb interleaved blocks at g * nb * 8 blocks */
            elelem_small_batch_q4_k_rows(isa, g->count, nb, expert + (r0 / 8) * nb * 8 * Q4_K_BLOCK_BYTES, 0, rows / 8,
                                         columns, out, CHUNK_ROWS);
        }
        for (int32_t c = 0; c < g->count; c++) {
            const int32_t pair = pairs[g->first + c];
            char * y = (char *) dst->data + (pair % n_used) * dst->nb[1] + (pair / n_used) * dst->nb[2];
            memcpy(y + r0 * sizeof(float), out + c * CHUNK_ROWS, (size_t) rows * sizeof(float));
        }
    }
    free(pairs);
    free(groups);
    free(prepared);
}

void elelem_experts_matmul(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    experts_matmul(ELELEM_SMALL_BATCH_AVX2, dst, ith, nth, weight);
}

void elelem_experts_matmul_avx512(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    experts_matmul(ELELEM_SMALL_BATCH_AVX512, dst, ith, nth, weight);
}
