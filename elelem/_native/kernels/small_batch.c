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

int elelem_small_batch_serves(enum ggml_type weight) {
    return weight == GGML_TYPE_Q8_0 || weight == GGML_TYPE_Q5_0 || weight == GGML_TYPE_Q4_0
        || weight == GGML_TYPE_Q4_1 || weight == GGML_TYPE_Q6_K;
}

enum ggml_type elelem_small_batch_activation_type(enum ggml_type weight) {
    return weight == GGML_TYPE_Q4_1 ? GGML_TYPE_Q8_1 : weight == GGML_TYPE_Q6_K ? GGML_TYPE_Q8_K : GGML_TYPE_Q8_0;
}

int64_t elelem_small_batch_prepared_bytes(int isa, enum ggml_type weight, int64_t n_in, int64_t n_columns) {
    return isa == ELELEM_SMALL_BATCH_AVX512 ? elelem_small_batch_avx512_prepared_bytes(weight, n_in, n_columns)
                                            : elelem_small_batch_avx2_prepared_bytes(weight, n_in, n_columns);
}

void elelem_small_batch_prepare(struct ggml_tensor * dst, int ith, int nth, void * isa) {
    if ((intptr_t) isa == ELELEM_SMALL_BATCH_AVX512) {
        elelem_small_batch_avx512_prepare(dst->src[0], ith, nth, dst->data);
    } else {
        elelem_small_batch_avx2_prepare(dst->src[0], ith, nth, dst->data);
    }
}

void elelem_small_batch_matmul(struct ggml_tensor * dst, int ith, int nth, void * isa) {
    if ((intptr_t) isa == ELELEM_SMALL_BATCH_AVX512) {
        elelem_small_batch_avx512_matmul(dst, ith, nth);
    } else {
        elelem_small_batch_avx2_matmul(dst, ith, nth);
    }
}
