/* Mixture-of-experts products for steps of generated tokens, by elelem's
 * small-batch kernels (experts.c says how and why):
 *   y = custom(src0 = the Q8_K columns, src1 = the chosen experts' ids)
 *       -> F32 (n_out, n_used, n_tokens), the weight as userdata,
 * where the columns are one a token (n_in, n_tokens), shared by its chosen
 * experts (gate, up), or one a chosen expert (n_in, n_used * n_tokens:
 * down), and ids is I32 (n_used, n_tokens).  The weight (n_in, n_out,
 * n_expert) is Q4_K that ggml's CPU backend repacked (block_q4_Kx8, n_out a
 * multiple of 8; the CPU must have AVX2, FMA and F16C), or Q6_K in plain host
 * memory (the CPU must have AVX-512 VNNI).  The weight is no source of the
 * op: the CPU backend accepts no op but its own matmuls on a tensor in a
 * repack buffer. */
#ifndef ELELEM_EXPERTS_H
#define ELELEM_EXPERTS_H

#include <stdint.h>
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

void elelem_experts_matmul(struct ggml_tensor * dst, int ith, int nth, void * weight);
/* The same, repacked Q4_K by the AVX-512 VNNI kernel (the CPU must have it): the same numbers. */
void elelem_experts_matmul_avx512(struct ggml_tensor * dst, int ith, int nth, void * weight);

/* Internal to the kernels: small_batch_q4_k.c's rows (isa: enum
 * elelem_small_batch_isa), for experts.c. */
void elelem_small_batch_q4_k_rows(int isa, int n, int64_t nb, const void * weight, int64_t g0, int64_t g1,
                                  const void * const * columns, float * out, size_t out_stride);

#ifdef __cplusplus
}
#endif

#endif
