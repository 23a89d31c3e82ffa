"""Running a test through each of elelem's kernel sets: the small-batch
kernels this CPU chooses and, where it would choose AVX-512's, the AVX2 ones
(a fixture), and ggml's own matmuls with elelem's kernels off."""
from __future__ import annotations

import pytest

from elelem import _core
from elelem.cpu import cpu_backend_info


def small_batch_isas() -> list[str]:
    # "avx2" is a second run only where the CPU would choose AVX-512's kernels;
    # elsewhere it would be the "best" run again, so it is not collected at all
    # (a skip would fail CI, which must not skip).
    backend = cpu_backend_info()
    avx512 = backend["small_batch_cpu"] == "avx512" and backend["small_batch_kernels"]
    return ["best", "avx2"] if avx512 else ["best"]


@pytest.fixture(params=small_batch_isas())
def small_batch_isa(request):
    """The small-batch kernels this CPU chooses, and then its AVX2 ones where
    it would choose AVX-512's."""
    if request.param == "best":
        yield cpu_backend_info()["small_batch_isa"]
        return
    before = _core._set_small_batch_isa("avx2")
    try:
        yield "avx2"
    finally:
        _core._set_small_batch_isa(before)


def through_ggml_alone(rows):
    """What ``rows() -> (result, step ops)`` gives with ggml's own mul_mat for
    every product (elelem's kernels off)."""
    before = _core._set_small_batch_isa("")
    try:
        result, ops = rows()
    finally:
        _core._set_small_batch_isa(before)
    assert "CUSTOM" not in ops
    return result
