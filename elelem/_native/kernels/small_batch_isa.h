/* Internal to the small-batch kernels: each instruction set's entry points,
 * called by small_batch.c's. */
#ifndef ELELEM_SMALL_BATCH_ISA_H
#define ELELEM_SMALL_BATCH_ISA_H

#include <stdint.h>
#include "ggml.h"

int64_t elelem_small_batch_avx512_prepared_bytes(enum ggml_type weight, int64_t n_in, int64_t n_columns);
void elelem_small_batch_avx512_prepare(const struct ggml_tensor * x, int ith, int nth, void * out);
void elelem_small_batch_avx512_matmul(struct ggml_tensor * dst, int ith, int nth);

int64_t elelem_small_batch_avx2_prepared_bytes(enum ggml_type weight, int64_t n_in, int64_t n_columns);
void elelem_small_batch_avx2_prepare(const struct ggml_tensor * x, int ith, int nth, void * out);
void elelem_small_batch_avx2_matmul(struct ggml_tensor * dst, int ith, int nth);

#endif
