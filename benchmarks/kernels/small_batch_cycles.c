/* One thread, one kernel: elelem's AVX2 small-batch matmul of a random
 * weight (rows x 896, type WTYPE) by N random columns, timed, best of R runs.
 * Built and run by benchmarks/kernel_cycles.py, which includes the kernel's
 * source as KERNEL (so a copy of an older kernel can be timed beside it).
 *
 *   small_batch_cycles WTYPE N ROWS REPEATS
 *
 * Prints: ms per matmul, core cycles per column-block (one 32-value weight
 * block times one column; the clock taken from a chain of dependent adds),
 * and a checksum of the product, equal for kernels that compute the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include KERNEL

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Core clock: a chain of dependent adds runs one add per cycle. */
static double core_hz(void) {
    unsigned long long x = 0;
    const long n = 200000000L;
    const double t0 = seconds();
    for (long i = 0; i < n; i++) {
        __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    }
    return 4.0 * n / (seconds() - t0);
}

static size_t block_bytes(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q8_0: return sizeof(block_q8_0_t);
        case GGML_TYPE_Q8_1: return sizeof(block_q8_1_t);
        case GGML_TYPE_Q5_0: return sizeof(block_q5_0_t);
        case GGML_TYPE_Q4_0: return sizeof(block_q4_0_t);
        case GGML_TYPE_Q4_1: return sizeof(block_q4_1_t);
        default: return 0;
    }
}

/* Random blocks, their fp16 scales (and Q4_1's m, Q8_1's s) kept small. */
static void * random_rows(enum ggml_type t, int64_t nb, int64_t rows) {
    const size_t bb = block_bytes(t);
    unsigned char * data = malloc(bb * nb * rows);
    for (size_t i = 0; i < bb * nb * rows; i++) {
        data[i] = (unsigned char) rand();
    }
    for (int64_t i = 0; i < nb * rows; i++) {
        uint16_t * h = (uint16_t *) (data + i * bb);
        h[0] = (uint16_t) (0x2000 + (rand() & 0xff));
        if (t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q8_1) {
            h[1] = (uint16_t) (0xa000 + (rand() & 0xff));
        }
    }
    return data;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s WTYPE N ROWS REPEATS\n", argv[0]);
        return 2;
    }
    const enum ggml_type wtype = (enum ggml_type) atoi(argv[1]);
    const int64_t n = atoi(argv[2]), rows = atoi(argv[3]), k = 896, nb = k / BLOCK;
    const int repeats = atoi(argv[4]);
    const enum ggml_type atype = wtype == GGML_TYPE_Q4_1 ? GGML_TYPE_Q8_1 : GGML_TYPE_Q8_0;  /* small_batch.c's choice */
    if (!block_bytes(wtype) || n < 1 || n > ELELEM_SMALL_BATCH_MAX_COLUMNS) {
        fprintf(stderr, "a 32-value weight type (Q8_0, Q5_0, Q4_0, Q4_1) and 1-8 columns\n");
        return 2;
    }
    srand(1);
    struct ggml_tensor w = {0}, x = {0}, prepared = {0}, dst = {0};
    w.type = wtype; w.ne[0] = k; w.ne[1] = rows; w.nb[1] = nb * block_bytes(wtype);
    w.data = random_rows(wtype, nb, rows);
    x.type = atype; x.ne[0] = k; x.ne[1] = n; x.nb[1] = nb * block_bytes(atype);
    x.data = random_rows(atype, nb, n);
    const size_t bytes = (size_t) elelem_small_batch_avx2_prepared_bytes(wtype, k, n);
    prepared.data = aligned_alloc(64, (bytes + 63) / 64 * 64);   /* ggml's buffers: aligned to 32 at least */
    elelem_small_batch_avx2_prepare(&x, 0, 1, prepared.data);
    dst.src[0] = &w; dst.src[1] = &prepared;
    dst.ne[0] = rows; dst.ne[1] = n; dst.nb[1] = rows * sizeof(float);
    dst.data = malloc(rows * n * sizeof(float));
    double best = 1e30;
    for (int i = 0; i < repeats; i++) {
        const double t0 = seconds();
        elelem_small_batch_avx2_matmul(&dst, 0, 1);
        const double t = seconds() - t0;
        best = t < best ? t : best;
    }
    double checksum = 0;
    for (int64_t i = 0; i < rows * n; i++) {
        checksum += ((float *) dst.data)[i] * (double) (i % 7 + 1);
    }
    printf("%.4f ms %.3f cycles %.9g checksum\n", best * 1e3, best * core_hz() / ((double) rows * nb * n), checksum);
    return 0;
}
