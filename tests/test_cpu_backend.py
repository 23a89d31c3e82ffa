"""The CPU backend module chosen at import, what it reports, and AMX.

AMX kernels run only on CPUs that have AMX (Intel Sapphire Rapids and later);
elsewhere those tests skip, with the reason.  The tile-config fix they depend
on is checked everywhere a C++ compiler is: see
test_amx_tile_config_fix_keeps_the_config_stores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import elelem
from elelem import _core
from elelem.cpu import amx_status, amx_types, cpu_flags, small_batch_status, system_info
from synthetic import TinyConfig, reference_logits

ROOT = Path(__file__).resolve().parents[1]
FIX_HEADER = ROOT / "cmake" / "amx_tile_config_fix.h"

# ggml_tile_config_init() from ggml-cpu/amx/mmq.cpp, reduced: the stores that
# GCC 12 deletes at -O2 are the rows/colsb ones, before ldtilecfg.
TILE_CONFIG_INIT = r"""
#include <immintrin.h>
#include <stdint.h>
struct tile_config_t { uint8_t palette_id = 0; uint8_t start_row = 0; uint8_t reserved_0[14] = {0};
                       uint16_t colsb[16] = {0}; uint8_t rows[16] = {0}; };
void init(void) {
    alignas(64) tile_config_t tc = {};
    tc.palette_id = 1;
    tc.rows[0] = 8;  tc.colsb[0] = 64;
    tc.rows[2] = 16; tc.colsb[2] = 32;
    _tile_loadconfig(&tc);
}
"""


def _stores_before_ldtilecfg(asm: str) -> int:
    body = asm[: asm.index("ldtilecfg")]
    return sum(1 for line in body.splitlines() if line.strip().startswith("mov") and "(%r" in line.split(",")[-1])


def test_amx_tile_config_fix_keeps_the_config_stores(tmp_path):
    """The build forces cmake/amx_tile_config_fix.h into ggml's AMX source.  This
    compiles the same tile-config code with and without it: without it (GCC
    < 13) the rows/colsb stores are gone, with it every one is there."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.fail("no C++ compiler: elelem's build needs one, so this test must be able to run")
    src = tmp_path / "tile.cpp"
    src.write_text(TILE_CONFIG_INIT)

    def compile_(*extra):
        return subprocess.run([cxx, "-O2", "-mamx-tile", "-S", "-o", "-", *extra, str(src)],
                              check=True, capture_output=True, text=True).stdout

    fixed = _stores_before_ldtilecfg(compile_("-include", str(FIX_HEADER)))
    plain = _stores_before_ldtilecfg(compile_())
    # With the fix: the zeroing of the 64 bytes, the palette, and the rows and
    # colsb values (however GCC merges them), so at least 3 stores.
    assert fixed >= 3
    version = subprocess.run([cxx, "-dumpversion"], capture_output=True, text=True).stdout.strip()
    if int(version.split(".")[0]) < 13:
        # Without it GCC 12 keeps only a 16-byte zeroing store and the palette byte.
        assert plain < fixed, "the fix header did not bring back the deleted tile-config stores"


def test_the_chosen_cpu_variant_is_the_best_that_runs_here():
    info = _core.cpu_backend_info()
    scores = info["scores"]
    assert info["variant"] in scores and scores[info["variant"]] > 0
    if not info["forced"]:
        assert scores[info["variant"]] == max(scores.values())
    assert Path(info["module"]).is_file()
    compiled = {name for name, value in info["features"] if value == "1"}
    flags = cpu_flags()
    # A module compiled for an instruction set this CPU lacks would have scored 0.
    for feature, flag in (("AVX2", "avx2"), ("AVX512", "avx512f"), ("AVX_VNNI", "avx_vnni"),
                          ("AVX512_VNNI", "avx512_vnni"), ("AMX_INT8", "amx_int8")):
        if feature in compiled:
            assert flag in flags, f"{info['variant']} uses {feature}, which this CPU lacks"


def _python(*args, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """This interpreter in a fresh process, run from a folder with no elelem/ in it: from the
    checkout, -c and -m would import the source tree instead of the installed package."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).parent)


def _import_core_with(env_extra: dict) -> subprocess.CompletedProcess:
    return _python("-c", "import elelem._core as c; print(c.cpu_backend_info()['variant'])", env_extra=env_extra)



def test_a_native_modules_instruction_sets_are_checked_by_name():
    # -march=native may use extensions no ggml option names (ggml_backend_score
    # does not test them): the macros beside the module, by their cpuinfo flags.
    assert _core.missing_native_isa(["__AVX512FP16__", "__GFNI__", "__GNUC__"], ["gfni", "avx2"]) == ["avx512_fp16"]
    assert _core.missing_native_isa(["__AVX2__", "__SSE_MATH__"], ["avx2"]) == []


def test_a_native_build_on_a_cpu_lacking_one_of_its_instruction_sets_is_an_import_error(tmp_path):
    package = Path(elelem.__file__).parent
    isa = package / "_lib" / "libggml-cpu.isa"
    if _core.cpu_backend_info()["variant"] != "native":
        assert not isa.exists()  # the portable build: ggml's variants check themselves
        return
    macros = isa.read_text().split()
    assert "__AVX2__" in macros or "avx2" not in cpu_flags()
    lacking = [m for m, flag in _core.ISA_MACRO_CPU_FLAGS.items() if flag not in cpu_flags()]
    if not lacking:
        return   # a CPU with every instruction set the table knows: nothing to pretend
    copy = tmp_path / "elelem"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (copy / "_lib" / "libggml-cpu.isa").write_text("\n".join(macros + [lacking[0]]) + "\n")
    r = subprocess.run([sys.executable, "-c", "import elelem._core"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert r.returncode == 1 and "ImportError" in r.stderr, r.stderr
    assert "built for another CPU" in r.stderr and _core.ISA_MACRO_CPU_FLAGS[lacking[0]] in r.stderr

def test_forcing_a_variant_that_is_not_shipped_is_a_clear_import_error():
    r = _import_core_with({"ELELEM_CPU_VARIANT": "no-such-cpu"})
    assert r.returncode == 1
    assert "ImportError" in r.stderr and "no-such-cpu" in r.stderr and "has the CPU variants" in r.stderr


def test_forcing_the_chosen_variant_loads_it():
    chosen = _core.cpu_backend_info()["variant"]
    r = _import_core_with({"ELELEM_CPU_VARIANT": chosen})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == chosen


def test_info_system_reports_what_was_chosen():
    r = _python("-m", "elelem", "info", "--system", "--json")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["cpu_variant"] == _core.cpu_backend_info()["variant"]
    assert facts["repack_buffer_types"] == _core.cpu_backend_info()["extra_buffer_types"]
    assert isinstance(facts["amx"], bool) and facts["amx_reason"]
    text = _python("-m", "elelem", "info", "--system").stdout
    assert isinstance(facts["small_batch_kernels"], bool) and facts["small_batch_kernels_reason"]
    for label in ("cpu variant", "compiled with", "repack buffers", "amx", "small-batch kernels"):
        assert label in text


def test_amx_reasons():
    backend = {"variant": "haswell", "features": [("AVX2", "1")], "extra_buffer_types": ["CPU_REPACK"]}
    assert amx_status(backend, {"avx2"}) == (False, "this CPU has no AMX (amx_tile, amx_int8)")
    on_cpu, why = amx_status(backend, {"amx_tile", "amx_int8"})
    assert not on_cpu and "built without it" in why
    spr = {"variant": "sapphirerapids", "features": [("AMX_INT8", "1")], "extra_buffer_types": ["CPU_REPACK"]}
    on_cpu, why = amx_status(spr, {"amx_tile", "amx_int8"})
    assert not on_cpu and "arch_prctl" in why
    assert amx_status(dict(spr, extra_buffer_types=["AMX", "CPU_REPACK"]), {"amx_tile", "amx_int8"})[0]


def test_amx_takes_a_bool_or_the_weight_types_it_serves(tiny_model):
    """LLM(amx=...) as the core gets it: None every AMX type but
    AMX_SLOWER_TYPES, True every one, False none, and names exactly those types."""
    assert amx_types(True) is None and amx_types(False) == []
    default = amx_types(None)
    assert "q6_K" not in default and {"q4_0", "q4_1", "q8_0", "q4_K"} <= set(default)
    assert amx_types({"q4_1"}) == ["q4_1"] and amx_types("q8_0") == ["q8_0"]
    with pytest.raises(ValueError, match="'bf16' not among the types AMX takes"):
        amx_types(["q4_1", "bf16"])
    path, _ = tiny_model(TinyConfig(wtype="q8_0"))
    with pytest.raises(ValueError, match="amx: 'f16'"):
        elelem.LLM(path, amx={"f16"})
    with elelem.LLM(path, amx={"q4_1"}) as llm:  # no Q4_1 weight here, so nothing goes to AMX
        assert "AMX" not in llm.repacked


def test_small_batch_kernels_follow_the_cpu_the_module_and_the_switch():
    avx2 = [("AVX2", "1"), ("FMA", "1"), ("F16C", "1")]
    base = {"variant": "zen4", "features": avx2, "small_batch_cpu": "avx512", "small_batch_isa": "avx512",
            "small_batch_kernels": True}
    on, why = small_batch_status(base)
    assert on and why.startswith("AVX-512 VNNI:")
    assert small_batch_status(dict(base, small_batch_cpu="avx2", small_batch_isa="avx2"))[1].startswith("AVX2:")
    assert small_batch_status(dict(base, small_batch_kernels=False, small_batch_cpu="", small_batch_isa="")) == (
        False, "this CPU has no AVX2, FMA or F16C")
    on, why = small_batch_status(dict(base, variant="sandybridge", features=[("AVX", "1")], small_batch_kernels=False))
    assert not on and "'sandybridge'" in why
    assert "ELELEM_SMALL_BATCH=0" in small_batch_status(dict(base, small_batch_kernels=False))[1]
    # the core itself: the best set the CPU runs, unless switched off or capped
    info = _core.cpu_backend_info()
    flags = cpu_flags()
    expected_cpu = ("avx512" if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= flags else "avx2") \
        if {"avx2", "fma", "f16c"} <= flags else ""
    assert info["small_batch_cpu"] == expected_cpu
    compiled = {name for name, value in info["features"] if value == "1"}
    switch = os.environ.get("ELELEM_SMALL_BATCH", "")
    on = bool(expected_cpu) and {"AVX2", "FMA", "F16C"} <= compiled and switch != "0"
    assert info["small_batch_kernels"] == on
    assert info["small_batch_isa"] == ((expected_cpu if switch != "avx2" else "avx2") if on else "")
    probe = "import elelem._core as c; i = c.cpu_backend_info(); print(i['small_batch_kernels'], i['small_batch_isa'])"
    r = _python("-c", probe, env_extra={"ELELEM_SMALL_BATCH": "0"})
    assert r.returncode == 0 and r.stdout.split() == ["False"], (r.stdout, r.stderr)
    if on:
        r = _python("-c", probe, env_extra={"ELELEM_SMALL_BATCH": "avx2"})
        assert r.returncode == 0 and r.stdout.split() == ["True", "avx2"], (r.stdout, r.stderr)
    with pytest.raises(ValueError, match="unknown"):
        _core._set_small_batch_isa("avx3")
    if expected_cpu != "avx512":
        with pytest.raises(ValueError, match="cannot run"):
            _core._set_small_batch_isa("avx512")


def test_repack_false_keeps_every_weight_in_place(tiny_model):
    cfg = TinyConfig(wtype="q8_0")
    path, _ = tiny_model(cfg)
    with elelem.LLM(path, repack=False) as llm:
        assert llm.repacked == {}


AMX_ON = system_info()["amx"]
AMX_PROMPT = np.random.default_rng(7).integers(0, 96, 40)  # a batch of 40 rows: AMX's GEMM path


@pytest.mark.hardware
@pytest.mark.skipif(not AMX_ON, reason=f"AMX is off here: {system_info()['amx_reason']}")
@pytest.mark.parametrize("wtype, dims", [("q8_0", {}), ("q4_1", {}),
                                          ("q4_1", dict(n_embd=576, n_ff=1536, n_head=9, n_head_kv=3))])
def test_amx_matmul_matches_numpy_and_the_avx512_path(tiny_model, wtype, dims):
    """At SmolLM2-135M's shapes AMX's sums part from the AVX-512 path's (by
    0.7% of the logits' scale, measured), but they stay as near NumPy's."""
    cfg = TinyConfig(wtype=wtype, **dims)
    path, weights = tiny_model(cfg)
    want = reference_logits(weights, cfg, AMX_PROMPT)
    with elelem.LLM(path, kv_type="f32", amx=True) as llm:
        assert llm.repacked.get("AMX", 0) > 0, llm.repacked
        amx = llm.eval(AMX_PROMPT, all_logits=True)
    with elelem.LLM(path, kv_type="f32", amx=False) as llm:
        assert "AMX" not in llm.repacked
        plain = llm.eval(AMX_PROMPT, all_logits=True)
    scale = np.abs(want).max()
    # Q8_0: both paths quantize activations to 8 bits per 32 (see test_core_forward).
    assert np.abs(amx - want).max() <= 3e-2 * scale
    assert np.abs(amx - plain).max() <= 1e-2 * scale
    assert (amx.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(amx - want).max() <= 1.1 * np.abs(plain - want).max()  # as accurate as the AVX-512 path
