"""The CPU-variant choice on Linux aarch64, run here on any machine.

On aarch64 the core scores ggml's ARM variants from /proc/cpuinfo's Features
(cpu_backend.pxi: score_cpu_variants, best_cpu_variant) by the rule of
their own check (ggml-cpu/arch/arm/cpu-feats.cpp).  The fixtures
(tests/support/fixtures/cpuinfo) are the /proc/cpuinfo of:
- a Neoverse-V1 (AWS Graviton3, c7g.xlarge): SVE and i8mm, no SVE2;
- a Cortex-A76 (Raspberry Pi 5): dotprod and FP16, no SVE, no i8mm;
- a Linux VM on an Apple M2: i8mm and bf16 but no SVE, and ggml's Linux
  ladder has no i8mm variant without SVE, so it takes the dotprod/FP16 one;
- a Neoverse-V2 (NVIDIA Grace): SVE2 and i8mm.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from elelem import _core
from elelem.cpu import cpu_model_name_from

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "support" / "fixtures" / "cpuinfo"
GGML_VARIANTS = ROOT / "third_party" / "ggml" / "src" / "CMakeLists.txt"
LINUX_ARM = list(_core.ARM_VARIANT_FEATURES)


def features(name: str) -> set[str]:
    found = _core.cpuinfo_features((FIXTURES / name).read_text())
    assert found is not None
    return found


@pytest.mark.parametrize("fixture, variant, score", [
    ("neoverse_v1_graviton3.txt", "armv8.6_1", 1 + 2 + 4 + 8 + 16),
    ("cortex_a76_raspberry_pi5.txt", "armv8.2_2", 1 + 2 + 4),
    ("apple_m2_linux_vm.txt", "armv8.2_2", 1 + 2 + 4),
    ("neoverse_v2_grace.txt", "armv8.6_2", 1 + 2 + 4 + 8 + 16 + 32),
])
def test_the_best_arm_variant_the_cpu_runs_is_chosen(fixture, variant, score):
    scores = _core.score_cpu_variants(features(fixture), LINUX_ARM)
    assert _core.best_cpu_variant(scores) == variant
    assert scores[variant] == score
    # every variant above it needs a feature this CPU lacks
    assert all(s == 0 for name, s in scores.items() if name.startswith("armv9"))


def test_the_apple_vm_has_i8mm_that_no_linux_variant_without_sve_uses():
    apple = features("apple_m2_linux_vm.txt")
    assert {"i8mm", "asimddp", "asimdhp", "fphp"} <= apple and "sve" not in apple
    scores = _core.score_cpu_variants(apple, LINUX_ARM)
    assert [name for name, s in scores.items() if s > 0] == ["armv8.0_1", "armv8.2_1", "armv8.2_2"]


def test_without_the_best_module_the_next_one_that_runs_is_chosen():
    v1 = features("neoverse_v1_graviton3.txt")
    shipped = [name for name in LINUX_ARM if name != "armv8.6_1"]
    assert _core.best_cpu_variant(_core.score_cpu_variants(v1, shipped)) == "armv8.2_3"
    assert _core.best_cpu_variant(_core.score_cpu_variants(v1, ["armv8.0_1"])) == "armv8.0_1"


def test_a_cpu_that_runs_none_of_the_modules_gets_none():
    # a Cortex-A72 (Raspberry Pi 4): Armv8.0, no dotprod
    a72 = _core.cpuinfo_features("processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\n")
    assert _core.best_cpu_variant(_core.score_cpu_variants(a72, ["armv8.2_1", "armv8.2_2"])) is None
    assert _core.best_cpu_variant(_core.score_cpu_variants(a72, LINUX_ARM)) == "armv8.0_1"


def test_modules_it_cannot_score_are_left_to_their_own_check():
    # x86's variants and a native module score themselves (or the native ISA
    # check decides); an unknown feature set leaves every module to its own.
    v1 = features("neoverse_v1_graviton3.txt")
    assert _core.score_cpu_variants(v1, ["haswell", "native"]) == {"haswell": None, "native": None}
    assert set(_core.score_cpu_variants(None, LINUX_ARM).values()) == {None}
    # x86's flags (qemu-user shows the host's /proc/cpuinfo): not this CPU's
    x86 = _core.cpuinfo_features("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f\n")
    assert set(_core.score_cpu_variants(x86, LINUX_ARM).values()) == {None}


def test_the_variants_are_ggmls_linux_arm_ladder():
    # the table must follow ggml's GGML_CPU_ALL_VARIANTS list for Linux ARM
    text = GGML_VARIANTS.read_text()
    block = text.split('elseif(GGML_SYSTEM_ARCH STREQUAL "ARM")')[1].split("elseif (CMAKE_SYSTEM_NAME")[0]
    listed = {m.group(1): tuple(m.group(2).split())
              for m in re.finditer(r"ggml_add_cpu_backend_variant\(([^\s)]+)\s*([^)]*)\)", block)}
    ours = {name: tuple("FP16_VECTOR_ARITHMETIC" if f == "FP16" else f for f in feats)
            for name, feats in _core.ARM_VARIANT_FEATURES.items()}
    assert ours == listed


def test_features_are_those_every_processor_lists():
    text = ("processor\t: 0\nFeatures\t: fp asimd asimddp\n\n"
            "processor\t: 1\nFeatures\t: fp asimd\n")
    assert _core.cpuinfo_features(text) == {"fp", "asimd"}
    assert _core.cpuinfo_features("processor\t: 0\nflags\t\t: fpu sse4_2 avx2\n") == {"fpu", "sse4_2", "avx2"}
    assert _core.cpuinfo_features("processor\t: 0\nuarch\t: sifive,u74-mc\n") is None


def test_a_native_arm_module_on_a_lesser_cpu_is_refused_by_name():
    # cmake/native_cpu_features_arm.cmake writes the ACLE macros of its flags
    macros = ["__ARM_FEATURE_DOTPROD", "__ARM_FEATURE_SVE", "__ARM_FEATURE_MATMUL_INT8", "__ARM_FP"]
    assert _core.missing_native_isa(macros, features("cortex_a76_raspberry_pi5.txt")) == ["i8mm", "sve"]
    assert _core.missing_native_isa(macros, features("neoverse_v1_graviton3.txt")) == []


@pytest.mark.parametrize("fixture, name", [
    ("neoverse_v1_graviton3.txt", "Arm Neoverse-V1"),
    ("cortex_a76_raspberry_pi5.txt", "Arm Cortex-A76"),
    ("apple_m2_linux_vm.txt", "Apple M2 Avalanche"),
    ("neoverse_v2_grace.txt", "Arm Neoverse-V2"),
])
def test_the_arm_core_is_named_from_its_part_number(fixture, name):
    assert cpu_model_name_from((FIXTURES / fixture).read_text()) == name


def test_every_kernel_entry_point_the_core_declares_has_a_stub_for_other_cpus():
    # On CPUs other than x86-64 setup.py compiles kernels/portable.c instead
    # of the x86 kernels: the core must still link.
    pxi = (ROOT / "elelem" / "_native" / "ggml.pxi").read_text()
    declared = set(re.findall(r"^\s+\S.*?\b(elelem_\w+)\(", pxi, re.M))
    stubs = (ROOT / "elelem" / "_native" / "kernels" / "portable.c").read_text()
    defined = set(re.findall(r"^\S.*?\b(elelem_\w+)\([^;]*\{", stubs, re.M))
    assert declared and declared == defined
    assert re.search(r"elelem_small_batch_cpu\(void\) \{\s*return ELELEM_SMALL_BATCH_NONE;", stubs)
