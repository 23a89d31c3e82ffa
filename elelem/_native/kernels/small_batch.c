/* The small-batch kernels' entry points: which instruction set this CPU
 * runs, and the dispatch to that set's kernels (small_batch.h). */
#include "small_batch.h"
#include "small_batch_isa.h"

int elelem_small_batch_cpu(void) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) {
        return ELELEM_SMALL_BATCH_NONE;
    }
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")
            && __builtin_cpu_supports("avx512vnni")) {
        return ELELEM_SMALL_BATCH_AVX512;
    }
    return ELELEM_SMALL_BATCH_AVX2;
}

int elelem_small_batch_one_token_pays(void) {
    /* One-token steps gain from the AVX-512 kernels on AMD's cores (Zen 5:
     * Qwen2.5-Coder-0.5B 14.5 against 18.6 ms a token) and lose on Intel's
     * (Sapphire Rapids, one thread: a 32768 x 2048 output head 1.4x slower
     * in Q6_K, 1.5x in Q4_1, 1.07x in Q8_0), where ggml's mul_mat keeps them. */
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
}

int elelem_small_batch_serves(enum ggml_type weight) {
    return weight == GGML_TYPE_Q8_0 || weight == GGML_TYPE_Q5_0 || weight == GGML_TYPE_Q4_0
        || weight == GGML_TYPE_Q4_1 || weight == GGML_TYPE_Q6_K;
}

enum ggml_type elelem_small_batch_activation_type(enum ggml_type weight) {
    return weight == GGML_TYPE_Q4_1 ? GGML_TYPE_Q8_1 : weight == GGML_TYPE_Q6_K ? GGML_TYPE_Q8_K : GGML_TYPE_Q8_0;
}

/* A product of more than ELELEM_SMALL_BATCH_MAX_COLUMNS columns runs as
 * groups of that many (the last one shorter), each prepared and multiplied
 * as a product of its own: the instruction sets' layouts and loops are
 * those of up to 8 columns, and every number is a column's own dot product
 * either way.  Each thread takes its rows of the weight for every group in
 * turn, so its rows are read again per group, from the cache. */
#define GROUP ELELEM_SMALL_BATCH_MAX_COLUMNS

static int64_t group_bytes(int isa, enum ggml_type weight, int64_t n_in, int64_t n_columns) {
    return isa == ELELEM_SMALL_BATCH_AVX512 ? elelem_small_batch_avx512_prepared_bytes(weight, n_in, n_columns)
                                            : elelem_small_batch_avx2_prepared_bytes(weight, n_in, n_columns);
}

/* Columns of group g of a product of n. */
static inline int64_t group_columns(int64_t n, int64_t g) {
    return n - g * GROUP < GROUP ? n - g * GROUP : GROUP;
}

int64_t elelem_small_batch_prepared_bytes(int isa, enum ggml_type weight, int64_t n_in, int64_t n_columns) {
    const int64_t full = n_columns / GROUP, rest = n_columns % GROUP;
    return full * group_bytes(isa, weight, n_in, GROUP) + (rest ? group_bytes(isa, weight, n_in, rest) : 0);
}

/* The weight type the prepared columns are for: the Q8_K columns serve Q6_K. */
static enum ggml_type weight_of_columns(enum ggml_type columns) {
    return columns == GGML_TYPE_Q8_K ? GGML_TYPE_Q6_K : columns == GGML_TYPE_Q8_1 ? GGML_TYPE_Q4_1 : GGML_TYPE_Q8_0;
}

void elelem_small_batch_prepare(struct ggml_tensor * dst, int ith, int nth, void * isa) {
    const struct ggml_tensor * x = dst->src[0];
    const int mode = (int) (intptr_t) isa;
    const int64_t stride = group_bytes(mode, weight_of_columns(x->type), x->ne[0], GROUP);
    for (int64_t g = 0; g * GROUP < x->ne[1]; g++) {
        struct ggml_tensor columns = *x;   /* the group's columns, a view by hand */
        columns.ne[1] = group_columns(x->ne[1], g);
        columns.data = (char *) x->data + g * GROUP * x->nb[1];
        void * out = (char *) dst->data + g * stride;
        if (mode == ELELEM_SMALL_BATCH_AVX512) {
            elelem_small_batch_avx512_prepare(&columns, ith, nth, out);
        } else {
            elelem_small_batch_avx2_prepare(&columns, ith, nth, out);
        }
    }
}

void elelem_small_batch_matmul(struct ggml_tensor * dst, int ith, int nth, void * isa) {
    const int mode = (int) (intptr_t) isa;
    const struct ggml_tensor * w = dst->src[0];
    const int64_t stride = group_bytes(mode, w->type, w->ne[0], GROUP);
    for (int64_t g = 0; g * GROUP < dst->ne[1]; g++) {
        struct ggml_tensor prepared = *dst->src[1], out = *dst;
        prepared.data = (char *) dst->src[1]->data + g * stride;
        out.src[1] = &prepared;
        out.ne[1] = group_columns(dst->ne[1], g);
        out.data = (char *) dst->data + g * GROUP * dst->nb[1];
        if (mode == ELELEM_SMALL_BATCH_AVX512) {
            elelem_small_batch_avx512_matmul(&out, ith, nth);
        } else {
            elelem_small_batch_avx2_matmul(&out, ith, nth);
        }
    }
}
