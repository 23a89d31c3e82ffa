"""The kernel choice (elelem/_native/graph/matmul.pxi: matmul_path and
experts_kernel_takes) as a table: the facts of one product and of the CPU
module in, the kernel out.  Whether each kernel gives the numbers claimed is
tests/test_core_runtime.py's and tests/test_moe.py's (bit for bit against
ggml); this pins down which one runs where, on any CPU."""
from __future__ import annotations

import pytest

from elelem._core import _matmul_path

# Each row: the facts that differ from a plain host weight, F32 2-D columns, a
# prompt step of one sequence, on a CPU module with tinyBLAS, the tiled
# K-quant kernel from 8 columns and elelem's AVX-512 kernels (one-token steps
# on ggml's kernels, one-column K-quant kernels on).
CASES = [
    # one token of a prompt: ggml's mul_mat, but Q6_K's and repacked Q4_K's read-ahead kernels
    (dict(type="q8_0", n=1), "ggml"),
    (dict(type="q6_K", n=1), "small_batch"),
    (dict(type="q6_K", n=1, one_column_k_quants=False), "ggml"),
    (dict(type="q6_K", n=1, small_batch_isa="avx2"), "ggml"),
    (dict(type="q4_K", n=1, repacked=True, plain=False), "small_batch_q4_k"),
    (dict(type="q4_K", n=1, repacked=True, plain=False, rows_of_8=False), "ggml"),
    (dict(type="q4_K", n=1, repacked=True, plain=False, small_batch_isa=""), "ggml"),
    # a one-token step where the AVX-512 kernels pay for every type (AMD's)
    (dict(type="q8_0", n=1, decode_kernels=True, small_batch_one_token=True), "small_batch"),
    (dict(type="q8_0", n=1, decode_kernels=True), "ggml"),
    # prompts: ggml's batch kernels, except where it would run a one-column kernel on every column
    (dict(type="q8_0", n=12), "ggml"),
    (dict(type="q4_1", n=12), "small_batch"),
    (dict(type="q6_K", n=7), "small_batch"),
    (dict(type="q6_K", n=8), "ggml"),
    (dict(type="q6_K", n=8, tiled_min_columns=2 ** 63 - 1), "small_batch"),
    (dict(type="q8_0", n=12, tinyblas_quantized=False), "small_batch"),
    (dict(type="q4_K", n=12, repacked=True, plain=False), "ggml"),
    (dict(type="f16", n=12), "ggml"),
    # a prompt step of several sequences: width-dependent kernels run per run
    (dict(type="q4_K", n=20, repacked=True, plain=False, step_runs=True), "per_run"),
    (dict(type="q6_K", n=20, step_runs=True), "runs_as_alone"),
    (dict(type="q6_K", n=5, step_runs=True), "small_batch"),
    (dict(type="q8_0", n=20, step_runs=True), "ggml"),
    (dict(type="q6_K", n=20, step_runs=True, output_rows=True), "ggml"),
    (dict(type="q6_K", n=3, output_runs=True, output_rows=True), "output_runs_as_alone"),
    (dict(type="f32", n=3, output_runs=True, output_rows=True), "output_runs_as_alone"),
    (dict(type="q8_0", n=3, output_runs=True, output_rows=True), "ggml"),   # tinyBLAS: the same numbers at any width
    # steps of generated tokens, of any width: one-token numbers
    (dict(type="q8_0", n=4, decode_kernels=True), "small_batch"),
    (dict(type="q8_0", n=4, decode_kernels=True, small_batch_isa=""), "one_column_each"),
    (dict(type="q8_0", n=12, decode_kernels=True, small_batch_isa=""), "one_column_each"),
    (dict(type="q8_0", n=16, decode_kernels=True, small_batch_isa=""), "one_column_each"),
    (dict(type="q4_K", n=12, decode_kernels=True, small_batch_isa=""), "one_column_each"),
    (dict(type="q5_K", n=64, decode_kernels=True), "one_column_each"),
    (dict(type="q8_0", n=64, decode_kernels=True), "small_batch"),
    (dict(type="q4_K", n=64, decode_kernels=True, repacked=True, plain=False, small_batch_isa=""),
     "one_column_each"),
    (dict(type="q4_K", n=4, decode_kernels=True, repacked=True, plain=False), "small_batch_q4_k"),
    (dict(type="q4_K", n=20, decode_kernels=True, repacked=True, plain=False, small_batch_isa="avx2"),
     "small_batch_q4_k"),
    (dict(type="q4_0", n=4, decode_kernels=True, repacked=True, plain=False), "one_column_each"),
    (dict(type="f32", n=4, decode_kernels=True), "one_column_each"),
    (dict(type="f32", n=1, decode_kernels=True), "ggml"),
    # a float weight, a LoRA adapter's factor or the model's: one-token numbers too
    (dict(type="f16", n=4, decode_kernels=True, adapter=True), "one_column_each"),
    (dict(type="bf16", n=8, decode_kernels=True, adapter=True), "one_column_each"),
    (dict(type="f16", n=4, decode_kernels=True), "one_column_each"),
    (dict(type="bf16", n=20, decode_kernels=True), "one_column_each"),
    (dict(type="f16", n=4, decode_kernels=True, host=False), "ggml"),
    (dict(type="f16", n=4, adapter=True), "ggml"),
    (dict(type="q8_0", n=4, decode_kernels=True, adapter=True), "small_batch"),
    # weights elsewhere (AMX tiles, a GPU) and columns that are not plain 2-D keep ggml's
    (dict(type="q8_0", n=4, decode_kernels=True, plain=False), "ggml"),
    (dict(type="q8_0", n=4, decode_kernels=True, host=False), "ggml"),
    (dict(type="q8_0", n=4, decode_kernels=True, x_simple=False), "ggml"),
    (dict(type="q8_0", n=4, decode_kernels=True, x_f32=False), "one_column_each"),
]


@pytest.mark.parametrize("facts, path", CASES, ids=[
    f"{i}-" + "-".join(f"{k}={v}" for k, v in facts.items()) for i, (facts, _) in enumerate(CASES)])
def test_each_product_takes_the_kernel_the_rules_give(facts, path):
    assert _matmul_path(**facts) == path


EXPERT_CASES = [
    # repacked Q4_K: ggml's gemv a row in every step, so any step
    (dict(type="q4_K", n=1, repacked=True, plain=False), True),
    (dict(type="q4_K", n=512, repacked=True, plain=False), True),
    (dict(type="q4_K", n=512, repacked=True, plain=False, small_batch_isa="avx2"), True),
    (dict(type="q4_K", n=1, repacked=True, plain=False, one_column_k_quants=False), False),
    (dict(type="q4_K", n=8, repacked=True, plain=False, small_batch_isa=""), False),
    (dict(type="q4_K", n=8), False),                          # plain Q4_K: ggml's tiled kernel from 8 rows
    # Q6_K: vec_dot's numbers, which only steps of generated tokens (and one token) want
    (dict(type="q6_K", n=8, decode_kernels=True), True),
    (dict(type="q6_K", n=1), True),
    (dict(type="q6_K", n=8), False),
    (dict(type="q6_K", n=8, decode_kernels=True, small_batch_isa="avx2"), False),
    (dict(type="q8_0", n=8, decode_kernels=True), False),
    (dict(type="q6_K", n=8, decode_kernels=True, host=False), False),
]


@pytest.mark.parametrize("facts, takes", EXPERT_CASES, ids=[
    f"{i}-" + "-".join(f"{k}={v}" for k, v in facts.items()) for i, (facts, _) in enumerate(EXPERT_CASES)])
def test_the_experts_kernel_takes_the_stacks_whose_numbers_it_gives(facts, takes):
    assert _matmul_path(experts=True, **facts) == ("experts" if takes else "ggml")


def test_unknown_facts_are_refused():
    with pytest.raises(TypeError, match="unknown facts"):
        _matmul_path(type="q8_0", n=1, colour="blue")
    with pytest.raises(ValueError, match="unknown ggml type"):
        _matmul_path(type="q9_9", n=1)
