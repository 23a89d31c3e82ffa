/* Small-batch matmuls for steps of generated tokens (1 to 8 columns), and
 * for the wider products that ggml would run as its one-column kernel on
 * every column (Q4_1 prompts: graph/blocks.pxi says which), in groups of 8.
 *
 * A step that carries only generated tokens (several streams' next tokens,
 * or a draft being verified) multiplies each weight by a handful of columns.
 * ggml runs such a product as one one-column dot product per column, each
 * decoding every weight block again: compute that grows with the columns
 * while the weights are read once.  These kernels decode each block once for
 * all the columns and give, bit for bit, the numbers ggml's one-column AVX2
 * kernels give (small_batch_avx512.c says how), so a batched step rounds
 * exactly as token-by-token decoding does.  They take one column too (the
 * graph builder uses that with AVX-512, where it is faster than ggml's
 * mul_mat for a one-token step, with the same numbers).
 *
 * Two instruction sets, chosen at run time: AVX-512 VNNI (two columns per
 * zmm: small_batch_avx512.c) and AVX2 (a column per ymm: small_batch_avx2.c).
 * Both give the same numbers, ggml's AVX2 ones.
 *
 * Used as two ggml custom ops after ggml_cpy() has quantized the columns
 * (with the CPU backend's own quantizer, as its mul_mat does), the ISA
 * passed as their userdata, (void *) (intptr_t) isa:
 *   prepared = custom(src0 = the Q8_0/Q8_1/Q8_K columns) -> I8, prepared_bytes()
 *   y        = custom(src0 = weight, src1 = prepared) -> F32 (rows, columns)
 * Only for weights in plain host memory, and only with an ISA that
 * elelem_small_batch_cpu() says this CPU runs. */
#ifndef ELELEM_SMALL_BATCH_H
#define ELELEM_SMALL_BATCH_H

#include <stdint.h>
#include "ggml.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The columns the instruction sets' kernels take at once; a wider product
 * runs as groups of this many (small_batch.c). */
#define ELELEM_SMALL_BATCH_MAX_COLUMNS 8

enum elelem_small_batch_isa {
    ELELEM_SMALL_BATCH_NONE = 0,
    ELELEM_SMALL_BATCH_AVX2 = 1,     /* AVX2, FMA, F16C */
    ELELEM_SMALL_BATCH_AVX512 = 2,   /* and AVX-512 F/BW/VL/DQ/VNNI */
};

int elelem_small_batch_cpu(void);
int elelem_small_batch_one_token_pays(void);          /* AVX-512 kernels beat ggml's on one column here */                      /* the best ISA this CPU runs */
int elelem_small_batch_serves(enum ggml_type weight);  /* Q8_0, Q5_0, Q4_0, Q4_1, Q6_K */
enum ggml_type elelem_small_batch_activation_type(enum ggml_type weight);  /* Q8_1 for Q4_1, Q8_K for Q6_K, else Q8_0 */
int64_t elelem_small_batch_prepared_bytes(int isa, enum ggml_type weight, int64_t n_in, int64_t n_columns);
void elelem_small_batch_prepare(struct ggml_tensor * dst, int ith, int nth, void * isa);
void elelem_small_batch_matmul(struct ggml_tensor * dst, int ith, int nth, void * isa);

/* Q4_K weights that ggml's CPU backend repacked (CPU_REPACK: block_q4_Kx8 on
 * x86 with AVX2), 1 to 8 columns, with the numbers of its one-column gemv
 * (small_batch_q4_k.c); the CPU must have AVX2, FMA and F16C:
 *   y = custom(src0 = the Q8_K columns) -> F32 (rows, columns), the weight
 *       tensor as userdata.
 * The weight is no source of the op: the CPU backend accepts no op but its
 * own matmuls on a tensor in a repack buffer. */
void elelem_small_batch_q4_k_matmul(struct ggml_tensor * dst, int ith, int nth, void * weight);
/* The same with AVX-512 VNNI (the CPU must have it): the same numbers. */
void elelem_small_batch_q4_k_matmul_avx512(struct ggml_tensor * dst, int ith, int nth, void * weight);

#ifdef __cplusplus
}
#endif

#endif
