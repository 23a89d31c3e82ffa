"""The CPU elelem runs on: which of its CPU backend modules was chosen, what
that module was compiled with, and whether AMX and elelem's own small-batch
kernels are used, and why (not).

``elelem info --system`` prints :func:`system_info`.
"""
from __future__ import annotations

import logging
import platform
from typing import Optional

# The name itself, not `from . import _core`: that form reads as an import of the package
# `elelem`, whose lazy LLM would then sit below this module in the import graph.
from ._core import cpu_backend_info, cpuinfo_features

# Instruction sets that decide which ggml kernels run, as /proc/cpuinfo names them:
# x86-64's flags, then aarch64's Features.
KERNEL_FLAGS = ("sse4_2", "avx", "f16c", "fma", "bmi2", "avx2", "avx_vnni", "avx512f", "avx512bw",
                "avx512vl", "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
                "asimd", "fphp", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "svei8mm", "sme", "sme2")

# aarch64's /proc/cpuinfo has no model name: its MIDR fields, CPU implementer
# and CPU part, name the core (the kernel's arch/arm64/include/asm/cputype.h).
ARM_IMPLEMENTERS = {0x41: "Arm", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
                    0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft", 0xC0: "Ampere"}
ARM_PARTS = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55",
    (0x41, 0xD07): "Cortex-A57", (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73",
    (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76", (0x41, 0xD0C): "Neoverse-N1",
    (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510", (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4F): "Neoverse-V2",
    (0x41, 0xD80): "Cortex-A520", (0x41, 0xD81): "Cortex-A720", (0x41, 0xD82): "Cortex-X4",
    (0x41, 0xD84): "Neoverse-V3", (0x41, 0xD8E): "Neoverse-N3",
    (0x61, 0x022): "M1 Icestorm", (0x61, 0x023): "M1 Firestorm", (0x61, 0x032): "M2 Blizzard",
    (0x61, 0x033): "M2 Avalanche", (0xC0, 0xAC3): "AmpereOne",
}

# ggml types kept out of the AMX buffer type by default (they then take the
# AVX-512 path): a type goes here when, on an AMX CPU, its AMX prefill or
# decode is slower (docs/performance.md#amx-against-the-avx-512-path-and-llamacpp).
# Measured on Sapphire Rapids, one thread, CPU time: Q4_1, Q8_0 and Q4_K are
# faster on AMX; Q6_K is slower, both decoding (a 2048-wide model of Q6_K
# weights 21 against 12.6 ms a token; a 32768 x 2048 Q6_K output head 10.9
# against 7.8) and in a 256-token prompt (0.217 against 0.168 s).
AMX_SLOWER_TYPES: frozenset[str] = frozenset({"q6_K"})

AMX_BUFFER_TYPE = "AMX"

log = logging.getLogger("elelem")


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_flags() -> set[str]:
    """The running CPU's feature flags, as the kernel reports them (x86's flags,
    aarch64's Features; empty where unknown)."""
    return cpuinfo_features(_cpuinfo()) or set()


def cpu_model_name_from(text: str) -> Optional[str]:
    """The CPU's name in the text of /proc/cpuinfo: x86's model name, or on
    aarch64 the core its implementer and part numbers name (the first
    processor's)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key not in fields:
            fields[key] = value.strip()
    if fields.get("model name"):
        return fields["model name"]
    try:
        implementer, part = int(fields["CPU implementer"], 16), int(fields["CPU part"], 16)
    except (KeyError, ValueError):
        return None
    vendor = ARM_IMPLEMENTERS.get(implementer, f"implementer {implementer:#x}")
    return f"{vendor} {ARM_PARTS.get((implementer, part), f'part {part:#x}')}"


def cpu_model_name() -> Optional[str]:
    return cpu_model_name_from(_cpuinfo())


def amx_types(amx) -> Optional[list[str]]:
    """The ``amx_types`` the core takes for ``LLM(amx=...)``: None (every type
    ggml's AMX kernels take), or the list of types allowed.  ``amx`` is None
    (the default choice), a bool, or ggml type names (``{"q4_1", "q8_0"}``)."""
    if amx is None:
        return None if not AMX_SLOWER_TYPES else [t for t in _AMX_KERNEL_TYPES if t not in AMX_SLOWER_TYPES]
    if isinstance(amx, bool):
        return None if amx else []
    names = [amx] if isinstance(amx, str) else list(amx)
    unknown = [t for t in names if t not in _AMX_KERNEL_TYPES]
    if unknown:
        raise ValueError(f"amx: {', '.join(map(repr, unknown))} not among the types AMX takes "
                         f"({', '.join(_AMX_KERNEL_TYPES)})")
    return names


# The types ggml's AMX mul_mat has kernels for (qtype_has_amx_kernels in
# ggml-cpu/amx/common.h).
_AMX_KERNEL_TYPES = ("q4_0", "q4_1", "q8_0", "q4_K", "q5_K", "q6_K", "iq4_xs")


def _compiled_features(backend: dict) -> set[str]:
    return {name for name, value in backend["features"] if value == "1"}


def amx_status(backend: dict, flags: set[str]) -> tuple[bool, str]:
    """(on, why) for the loaded CPU backend on a CPU with ``flags``."""
    compiled = _compiled_features(backend)
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"AMX is x86-64's; this is {platform.machine()}"
    if not {"amx_tile", "amx_int8"} <= flags:
        return False, "this CPU has no AMX (amx_tile, amx_int8)"
    if "AMX_INT8" not in compiled:
        return False, (f"the CPU has AMX, but the '{backend['variant']}' CPU module was built without it "
                       "(rebuild natively on this machine, or use the portable build)")
    if AMX_BUFFER_TYPE not in backend["extra_buffer_types"]:
        return False, "the CPU module has AMX, but the kernel did not grant AMX tile state (arch_prctl)"
    kept_out = f"; {', '.join(sorted(AMX_SLOWER_TYPES))} take the AVX-512 path" if AMX_SLOWER_TYPES else ""
    return True, f"AMX matmuls for the weight types it supports{kept_out}; LLM(amx=False) or --no-amx turns it off"


#: The most memory the Q8_0 copies of Q5_0 weights may take when LLM(widen=None)
#: decides (about a 2.5 GB Q5_0 model's worth); widen=True lifts it.
WIDEN_AUTO_LIMIT = 1 << 30
#: By default the copies are made once prompt steps have evaluated this many
#: tokens: making them reads the Q5_0 weights and writes 34/22 of them (about
#: 0.4 s for Qwen2.5-0.5B's 268 MB on 2 cores), and a prompt token is then
#: about 0.8 ms faster there (prefill 183 -> 213 tok/s), so they pay from
#: about 500 tokens; before that a chat of short prompts does not hold them.
WIDEN_AFTER_PROMPT_TOKENS = 1024


def widen_status(backend: dict) -> tuple[bool, str]:
    """(possible, why) for widening Q5_0 weights to Q8_0 (elelem/_native/widen.pxi)
    on the loaded CPU backend: it pays through llamafile's tinyBLAS, and keeps
    llama.cpp's arithmetic bit for bit only on the AVX2 kernels."""
    compiled = _compiled_features(backend)
    missing = [f for f in ("AVX2", "LLAMAFILE") if f not in compiled]
    if missing:
        return False, f"the '{backend['variant']}' CPU module has no {' or '.join(missing)}"
    return True, "Q5_0 weights get Q8_0 copies for steps of two or more tokens; LLM(widen=False) turns it off"


def widen_q5_0(requested: Optional[bool], repack: bool, extra_bytes: int) -> bool:
    """Whether LLM(widen=requested, repack=repack) widens, when the copies
    would take ``extra_bytes``: by default only with repack (weights as stored without it)."""
    if requested is False or (requested is None and not repack) or extra_bytes == 0:
        return False
    possible, why = widen_status(cpu_backend_info())
    if not possible:
        if requested:
            log.warning("widen=True ignored: %s", why)
        return False
    if requested is None and extra_bytes > WIDEN_AUTO_LIMIT:
        log.info("not widening Q5_0 weights: the copies would take %.1f GiB (LLM(widen=True) allows it)",
                 extra_bytes / (1 << 30))
        return False
    return True


def widen_after(requested: Optional[bool]) -> int:
    """The prompt tokens after which LLM(widen=requested) makes its copies:
    at the first prompt when asked for, else once they pay."""
    return 0 if requested else WIDEN_AFTER_PROMPT_TOKENS


def small_batch_status(backend: dict) -> tuple[bool, str]:
    """(on, why) for elelem's own kernels for steps of 1-8 generated tokens
    (elelem/_native/kernels/small_batch.h): they need AVX2, FMA and F16C (and
    take AVX-512 VNNI where the CPU has it), and give the numbers of the CPU
    module's one-column kernels only where those are ggml's AVX2 ones."""
    if backend["small_batch_kernels"]:
        isa = "AVX-512 VNNI" if backend["small_batch_isa"] == "avx512" else "AVX2"
        if backend.get("small_batch_one_token"):
            one_token = "one-token steps too"
        elif backend.get("one_column_k_quants"):
            one_token = ("one-token steps too for repacked Q4_K" + (" and Q6_K" if isa != "AVX2" else "")
                         + ", reading the weight ahead")
        else:
            one_token = "one-token steps keep ggml's kernels"
        return True, (f"{isa}: Q8_0, Q5_0, Q4_0, Q4_1 and Q6_K matmuls (and AVX2: repacked Q4_K) of 2-8 "
                      f"generated tokens decode each weight once for all of them ({one_token}); "
                      "ELELEM_SMALL_BATCH=0 turns them off")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False, f"they are x86-64 code; on {platform.machine()} ggml's kernels compute every product"
    if not backend["small_batch_cpu"]:
        return False, "this CPU has no AVX2, FMA or F16C"
    if not {"AVX2", "FMA", "F16C"} <= _compiled_features(backend):
        return False, f"the '{backend['variant']}' CPU module has no AVX2, FMA or F16C"
    return False, "turned off by ELELEM_SMALL_BATCH=0"


def system_info() -> dict:
    backend = cpu_backend_info()
    flags = cpu_flags()
    amx_on, amx_why = amx_status(backend, flags)
    widen_on, widen_why = widen_status(backend)
    small_batch_on, small_batch_why = small_batch_status(backend)
    return {
        "cpu": cpu_model_name() or backend["description"],
        "cpu_flags": [f for f in KERNEL_FLAGS if f in flags],
        "cpu_variant": backend["variant"],
        "cpu_variant_forced": backend["forced"],
        "cpu_variants": backend["scores"],
        "cpu_module": backend["module"],
        "compiled_features": [name for name, value in backend["features"] if value == "1"],
        "repack_buffer_types": backend["extra_buffer_types"],
        "amx": amx_on,
        "amx_reason": amx_why,
        "widen_q5_0": widen_on,
        "widen_q5_0_reason": widen_why,
        "small_batch_kernels": small_batch_on,
        "small_batch_kernels_reason": small_batch_why,
    }
