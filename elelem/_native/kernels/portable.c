/* The entry points of elelem's small-batch and experts kernels on CPUs they
 * are not written for (every CPU but x86-64: the kernels are AVX2 and
 * AVX-512 intrinsics, and setup.py compiles them on x86-64 only).
 *
 * elelem_small_batch_cpu() says NONE, so the graph builder never chooses
 * them (graph/matmul.pxi, matmul_path and experts_kernel_takes: nothing of
 * elelem's runs with small_batch_isa NONE) and every product is ggml's.  The
 * rest exist so that the core links; a call would be a broken kernel
 * choice, so it aborts rather than compute nothing. */
#include "experts.h"
#include "small_batch.h"

int elelem_small_batch_cpu(void) {
    return ELELEM_SMALL_BATCH_NONE;
}

int elelem_small_batch_one_token_pays(void) {
    return 0;
}

int elelem_small_batch_serves(enum ggml_type weight) {
    (void) weight;
    return 0;
}

enum ggml_type elelem_small_batch_activation_type(enum ggml_type weight) {
    (void) weight;
    return GGML_TYPE_Q8_0;
}

int64_t elelem_small_batch_prepared_bytes(int isa, enum ggml_type weight, int64_t n_in, int64_t n_columns) {
    (void) isa; (void) weight; (void) n_in; (void) n_columns;
    return 0;
}

static void no_kernels(const char * name) {
    GGML_ABORT("%s: elelem's small-batch kernels are x86-64 only; the kernel choice must not pick them here", name);
}

void elelem_small_batch_prepare(struct ggml_tensor * dst, int ith, int nth, void * isa) {
    (void) dst; (void) ith; (void) nth; (void) isa;
    no_kernels(__func__);
}

void elelem_small_batch_matmul(struct ggml_tensor * dst, int ith, int nth, void * isa) {
    (void) dst; (void) ith; (void) nth; (void) isa;
    no_kernels(__func__);
}

void elelem_small_batch_q4_k_matmul(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    (void) dst; (void) ith; (void) nth; (void) weight;
    no_kernels(__func__);
}

void elelem_small_batch_q4_k_matmul_avx512(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    (void) dst; (void) ith; (void) nth; (void) weight;
    no_kernels(__func__);
}

void elelem_experts_matmul(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    (void) dst; (void) ith; (void) nth; (void) weight;
    no_kernels(__func__);
}

void elelem_experts_matmul_avx512(struct ggml_tensor * dst, int ith, int nth, void * weight) {
    (void) dst; (void) ith; (void) nth; (void) weight;
    no_kernels(__func__);
}
