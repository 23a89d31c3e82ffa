/* Internal to the small-batch kernels: the AVX-512 Q6_K one (small_batch_avx512_q6_k.c),
 * called by small_batch_avx512.c's entry points. */
#ifndef ELELEM_SMALL_BATCH_AVX512_Q6_K_H
#define ELELEM_SMALL_BATCH_AVX512_Q6_K_H

#include <stddef.h>
#include <stdint.h>
#include "ggml.h"

int64_t elelem_small_batch_q6_k_prepared_bytes(int64_t n_in, int64_t n_columns);
void elelem_small_batch_q6_k_prepare(const struct ggml_tensor * x, int ith, int nth, void * out);
/* The same layout from n (1 to 8) Q8_K columns of nb super-blocks given one by one. */
void elelem_small_batch_q6_k_prepare_columns(const void * const * columns, int64_t n, int64_t nb, void * out);
void elelem_small_batch_q6_k_rows(int64_t nb, const char * w, size_t w_stride, int64_t r0, int64_t r1,
                                  const void * prepared, int64_t n, float * out, size_t out_stride);

#endif
