/* Internal to the small-batch kernels: the AVX-512 Q6_K one (small_batch_avx512_q6_k.c),
 * called by small_batch_avx512.c's entry points. */
#ifndef ELELEM_SMALL_BATCH_AVX512_Q6_K_H
#define ELELEM_SMALL_BATCH_AVX512_Q6_K_H

#include <stddef.h>
#include <stdint.h>
#include "ggml.h"

int64_t elelem_small_batch_q6_k_prepared_bytes(int64_t n_in, int64_t n_columns);
void elelem_small_batch_q6_k_prepare(const struct ggml_tensor * x, int ith, int nth, void * out);
void elelem_small_batch_q6_k_rows(int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,
                                  const void * prepared, int64_t n, float * out, size_t out_stride);

#endif
