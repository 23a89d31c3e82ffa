"""Comparing batched greedy answers with the answers alone.

Batched steps run matmuls over two or more rows through other kernels than a
lone token (ggml hands n >= 2 to llamafile's tinyBLAS -- SmolLM2's Q8_0
output projection, for one -- and repacked weights to gemm rather than gemv),
and a shared step attends over more cells (a larger padded n_kv), for which
the f16 cache's softmax path takes other kernels.  Rounding differences grow
through the layers: measured on SmolLM2, up to ~0.15 in the logits from the
output projection and up to ~0.8 from the f16 attention path.  A batched
greedy answer may therefore leave the solo answer only where that answer had
a near-tie, its top two logits within NEAR_TIE.  Anything else is a bug.
"""
from __future__ import annotations

import numpy as np

NEAR_TIE = 1.0


def smallest_top2_gap(llm, prompt_ids: list[int], n: int) -> float:
    """The smallest top-1/top-2 logit gap over the first ``n`` greedy steps after ``prompt_ids``, alone."""
    with llm.new_session() as session:
        answer = session.generate_tokens(prompt_ids, n)
        session.reset()
        rows = session.eval(prompt_ids + answer, all_logits=True)[len(prompt_ids) - 1:]
    top2 = np.sort(rows, axis=1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def assert_same_or_near_tie(llm, prompt_text: str, got: str, want: str, n: int) -> None:
    if got == want:
        return
    gap = smallest_top2_gap(llm, llm.tokenize(prompt_text, special=True), n)
    assert gap < NEAR_TIE, f"{prompt_text!r}: {got!r} != {want!r}, and the solo answer has no near-tie (gap {gap:.3f})"
