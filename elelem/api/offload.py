"""Local GPUs: which backend modules load, which devices they bring, and how
many of a model's layers go to them.

The GPU backends (CUDA, Vulkan, Metal) are ggml modules in ``elelem/_lib``, loaded
the first time a model asks where to run (never at import: a machine with no
driver pays nothing).  Each outcome is logged with its reason, and an
explicit request for GPU layers that cannot be met is a :class:`DeviceError`,
never a silent run on the CPU.

The split follows llama.cpp (``llama_model::load_tensors``): the token
embeddings stay on the CPU; ``n_gpu_layers`` counts layers from the last
one backwards, and the output head goes to the GPU only when every layer
does and one more is asked for (``-1``, the default, or more than
``n_layer``).  Layers that do not fit a device's free memory -- after its
K/V, the output head and an estimate of the compute buffers -- stay on the
CPU, and the log says how many.  The same :class:`~elelem.api.devices.Placement`
then places them, as it places layers on RPC servers.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence

from .._core import LIB_DIR, cpu_device, load_gpu_module, local_devices  # names, not the package
from ..errors import DeviceError, InvalidArgumentError
from .devices import HANDSHAKE_TIMEOUT, Placement, connect_servers, plan_layers

log = logging.getLogger("elelem")

class GpuModule(NamedTuple):
    backend: str                  # elelem's name for it: "CUDA", "Metal", "Vulkan"
    file: str                     # in elelem/_lib (CMake names macOS modules .so too)
    registry: str                 # the name ggml's backend gives itself (Device.backend): Metal's is "MTL"
    device_list: Optional[str]    # the variable that names the devices it may use, if it has one


def gpu_modules(platform: str = sys.platform) -> tuple[GpuModule, ...]:
    """The GPU modules an elelem for ``platform`` may have, best first, as ggml's own registry
    orders them: CUDA before Vulkan for the same card, and Metal (macOS only) before Vulkan
    (MoltenVK)."""
    return tuple(m for m in (
        GpuModule("CUDA", "libggml-cuda.so", "CUDA", "CUDA_VISIBLE_DEVICES"),
        GpuModule("Metal", "libggml-metal.so", "MTL", None),
        GpuModule("Vulkan", "libggml-vulkan.so", "Vulkan", "GGML_VK_VISIBLE_DEVICES"),
    ) if m.backend != "Metal" or platform == "darwin")


#: This platform's.
GPU_MODULES = gpu_modules()
GPU_KINDS = ("gpu", "igpu")
#: Caps the free memory elelem counts on each GPU (bytes, or 512M / 2G / 1.5GiB):
#: to leave room for other programs, or to test what happens when layers do not fit.
MEMORY_LIMIT_ENV = "ELELEM_GPU_MEMORY_LIMIT"
#: Kept free on each GPU besides the estimate (the driver's and ggml's own small buffers).
HEADROOM_BYTES = 64 * 2**20


@dataclass
class ModuleStatus:
    backend: str             # "CUDA", "Vulkan"
    path: str
    state: str               # "loaded", "absent" (not built), "failed"
    reason: str = ""
    n_devices: int = 0


@dataclass
class Offload:
    """Where a model's layers run, and why: ``LLM.offload``."""
    placement: Placement
    output_device: int = -1              # index into placement.devices; -1: the CPU
    n_layer: int = 0
    reasons: list[str] = field(default_factory=list)
    estimate: dict = field(default_factory=dict)   # device name -> bytes it was expected to need

    @property
    def n_offloaded(self) -> int:
        return sum(1 for d in self.placement.layer_device if d >= 0)

    @property
    def summary(self) -> str:
        """ "24/24 layers on Vulkan0", "10/24 layers on CUDA0", "0/24 layers on a GPU (CPU)". """
        names = [d.name for i, d in enumerate(self.placement.devices) if self.placement.layers_of(i)]
        if not names:
            return f"0/{self.n_layer} layers on a GPU (CPU)"
        head = ", output on " + self.placement.devices[self.output_device].name if self.output_device >= 0 else ""
        return f"{self.n_offloaded}/{self.n_layer} layers on {'+'.join(names)}{head}"

    def as_dict(self) -> dict:
        return {"summary": self.summary, "n_layer": self.n_layer, "n_gpu_layers": self.n_offloaded,
                "devices": [{"name": d.name, "description": d.description, "backend": d.backend,
                             "layers": self.placement.layers_of(i)}
                            for i, d in enumerate(self.placement.devices)],
                "output": (self.placement.devices[self.output_device].name
                           if self.output_device >= 0 else "CPU"),
                "reasons": list(self.reasons)}


def lib_dir() -> str:
    return LIB_DIR


def load_gpu_modules(directory: Optional[str] = None) -> list[ModuleStatus]:
    """Load every GPU module this elelem was built with (once per process) and say how each went."""
    directory = directory or lib_dir()
    out = []
    for module in GPU_MODULES:
        backend, name = module.backend, module.file
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            out.append(ModuleStatus(backend, path, "absent", f"this elelem was built without {backend} ({name})"))
            continue
        said = _GgmlSays()
        logging.getLogger("elelem.ggml").addHandler(said)
        try:
            n = load_gpu_module(path)
        except OSError as error:
            out.append(ModuleStatus(backend, path, "failed", f"{name} could not be loaded: {error}"))
        except DeviceError as error:
            out.append(ModuleStatus(backend, path, "failed", f"{error} ({_start_failure_causes(module)})"))
        else:
            out.append(ModuleStatus(backend, path, "loaded",
                                    "" if n else f"{backend} found no device it can use" + _cpu_device_hint(backend),
                                    n))
        finally:
            logging.getLogger("elelem.ggml").removeHandler(said)
        if said.messages and out[-1].reason:   # the backend's own words: "driver version is insufficient", ...
            out[-1].reason += " (ggml: " + "; ".join(said.messages) + ")"
    return out


class _GgmlSays(logging.Handler):
    """The warnings and errors ggml logs while a module loads (a driver too old, ...)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage().strip())


def _start_failure_causes(module: GpuModule) -> str:
    if module.device_list is None:   # Metal: the system's framework, no driver of its own
        return f"no {module.backend} device: a Mac without a Metal GPU, or a macOS too old for ggml's {module.backend}"
    return (f"no {module.backend} driver, a driver too old for it, or a device list such as "
            f"{module.device_list} naming a device that is not there")


def _cpu_device_hint(backend: str) -> str:
    # ggml-vulkan leaves CPU-type devices (Mesa's lavapipe, llvmpipe) out unless they are named.
    return " (a software Vulkan device such as llvmpipe counts only when GGML_VK_VISIBLE_DEVICES names it)" \
        if backend == "Vulkan" else ""


def gpu_devices(directory: Optional[str] = None) -> tuple[list, list[ModuleStatus]]:
    """The local GPUs, best first (CUDA's, Metal's, then Vulkan's), each card once, and each module's status."""
    modules = load_gpu_modules(directory)
    order = [m.registry for m in GPU_MODULES]
    found = [d for d in local_devices() if d.kind in GPU_KINDS and d.backend in order]
    found.sort(key=lambda d: order.index(d.backend))   # stable: each backend's own order within
    devices: list = []  # elelem._core.Device objects
    seen: dict = {}  # card id -> the first Device seen for it
    for dev in found:
        card = dev.device_id
        if card is not None and card in seen:
            log.info("GPU %s (%s) is %s's card (%s) seen through %s: using %s's", dev.name, dev.description,
                     seen[card].name, card, dev.backend, seen[card].backend)
            continue
        if card is not None:
            seen[card] = dev
        devices.append(dev)
    return devices, modules


def memory_limit() -> Optional[int]:
    text = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not text:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?", text)
    if not match:
        raise InvalidArgumentError(f"{MEMORY_LIMIT_ENV}={text!r}: give bytes, or a number with K, M, G or T")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def free_memory(dev) -> int:
    free, _total = dev.memory()
    limit = memory_limit()
    return free if limit is None else min(free, limit)


def compute_bytes(hparams: dict, n_batch: int, kv_cells: int, flash_attn: bool, with_output: bool) -> int:
    """An estimate of one device's compute buffer (what ggml's scheduler reserves for a
    step of ``n_batch`` tokens): the activations of one layer, the attention scores
    (without flash attention: a float per cell, head and token) and the logits when the
    output head is there.  LLM logs it beside what the scheduler then reserved."""
    tokens = max(1, min(n_batch, kv_cells))
    n_embd = int(hparams["n_embd"])
    n_ff = _largest(hparams.get("n_ff", 4 * n_embd))
    n_head = _largest(hparams.get("n_head", 1))
    q_width = n_head * int(hparams.get("head_dim_k", n_embd // max(n_head, 1)))
    activations = tokens * (4 * n_embd + 2 * q_width + 3 * n_ff) * 4
    scores = 0 if flash_attn else 2 * tokens * kv_cells * n_head * 4
    logits = tokens * int(hparams["n_vocab"]) * 4 if with_output else 0
    return activations + scores + logits


def _largest(value) -> int:
    return int(max(value)) if isinstance(value, (list, tuple)) else int(value)


def explicit_request(n_gpu_layers, main_gpu, tensor_split) -> bool:
    """Whether the caller asked for GPU layers in so many words (else elelem may fall back)."""
    return (n_gpu_layers is not None and n_gpu_layers != 0) or tensor_split is not None or bool(main_gpu)


def plan_offload(n_layer: int, layer_bytes: Sequence[int], output_bytes: int, kv_bytes_per_layer: int,
                 hparams: dict, n_batch: int, kv_cells: int, flash_attn: bool,
                 n_gpu_layers: Optional[int] = None, main_gpu: int = 0, tensor_split=None,
                 devices: Optional[list] = None, modules: Optional[list[ModuleStatus]] = None,
                 output_head: bool = True) -> Offload:
    """Decide which layers go to which local GPU; every decision is logged with its reason.
    ``output_head`` False: the model has none to place (an encoder)."""
    if n_gpu_layers is not None and (isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int)):
        raise InvalidArgumentError(f"n_gpu_layers must be an integer, got {n_gpu_layers!r}")
    if isinstance(main_gpu, bool) or not isinstance(main_gpu, int) or main_gpu < 0:
        raise InvalidArgumentError(f"main_gpu must be a device index (0, 1, ...), got {main_gpu!r}")
    explicit = explicit_request(n_gpu_layers, main_gpu, tensor_split)
    cpu_only = Offload(Placement([], [-1] * n_layer), n_layer=n_layer)
    if n_gpu_layers == 0:
        cpu_only.reasons.append("n_gpu_layers=0: every layer on the CPU")
        log.info("offload: %s", cpu_only.reasons[0])
        return cpu_only
    if devices is None:
        devices, modules = gpu_devices()
    if not devices:
        why = "; ".join(m.reason for m in modules or [] if m.reason) or "no GPU backend module"
        if explicit:
            raise DeviceError(f"GPU layers were asked for (n_gpu_layers={n_gpu_layers}, main_gpu={main_gpu}, "
                              f"tensor_split={tensor_split}) but there is no GPU: {why}. "
                              "Pass n_gpu_layers=0 to run on the CPU.")
        cpu_only.reasons.append(f"no GPU: {why}")
        log.info("offload: every layer on the CPU: no GPU (%s)", why)
        return cpu_only
    if tensor_split is None:
        if main_gpu >= len(devices):
            raise DeviceError(f"main_gpu={main_gpu}, but there are {len(devices)} GPUs: "
                              + ", ".join(f"{i}: {d.name} ({d.description})" for i, d in enumerate(devices)))
        chosen = [devices[main_gpu]]
    else:
        chosen = list(devices)
    want = n_layer + 1 if n_gpu_layers is None or n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    if not output_head:
        want = min(want, n_layer)
    offload = _fit(n_layer, want, chosen, tensor_split, layer_bytes, output_bytes, kv_bytes_per_layer,
                   hparams, n_batch, kv_cells, flash_attn)
    log.info("offload: %s%s", offload.summary, "".join(f"; {r}" for r in offload.reasons))
    return offload


def keep_supported(offload: Offload, unsupported) -> Offload:
    """Take back to the CPU every layer (and the output head) with a weight its device
    cannot hold or multiply: ``unsupported(device, layers, with_output)`` lists those
    weights as (layer or -1, name, bytes) (elelem._core.unsupported_weights)."""
    placement = offload.placement
    before = offload.summary
    for index, dev in enumerate(placement.devices):
        for il, name, size in unsupported(dev, placement.layers_of(index), offload.output_device == index):
            what = "the output head" if il < 0 else f"layer {il}"
            reason = (f"{what} stays on the CPU: {dev.name} cannot hold or multiply {name} "
                      f"({size / 2**20:.0f} MiB)")
            if il < 0:
                offload.output_device = -1
            elif placement.layer_device[il] >= 0:
                placement.layer_device[il] = -1
            else:
                continue
            offload.reasons.append(reason)
            log.warning("offload: %s", reason)
    if offload.n_offloaded == 0 and offload.output_device < 0 and placement.devices:
        offload.placement = Placement([], [-1] * offload.n_layer)
    if offload.summary != before:
        log.info("offload: %s", offload.summary)
    return offload


def _fit(n_layer, want, devices, tensor_split, layer_bytes, output_bytes, kv_bytes_per_layer,
         hparams, n_batch, kv_cells, flash_attn) -> Offload:
    """The largest split of up to ``want`` layers (n_layer + 1: the output too) that fits."""
    free = [free_memory(d) for d in devices]
    reasons = []
    for n in range(want, -1, -1):
        n_layers = min(n, n_layer)
        placement = plan_layers(n_layer, devices, n_layers, tensor_split)
        output_device = placement.layer_device[n_layer - 1] if n > n_layer else -1
        if n > n_layer and output_device < 0:
            output_device = 0
        needs = {}
        fits = True
        for index, dev in enumerate(devices):
            layers = placement.layers_of(index)
            with_output = output_device == index
            if not layers and not with_output:
                continue
            need = (sum(layer_bytes[il] for il in layers) + kv_bytes_per_layer * len(layers)
                    + (output_bytes if with_output else 0)
                    + compute_bytes(hparams, n_batch, kv_cells, flash_attn, with_output) + HEADROOM_BYTES)
            needs[dev.name] = need
            if need > free[index]:
                fits = False
        if fits:
            if n < want:
                head = " (the output head stays on the CPU)" if want > n_layer else ""
                limit = f" (capped by {MEMORY_LIMIT_ENV})" if memory_limit() is not None else ""
                reasons.append(f"too little memory: {n_layers} of {min(want, n_layer)} layers fit in "
                               + ", ".join(f"{d.name}'s {free[i] / 2**20:.0f} MiB free" for i, d in enumerate(devices))
                               + limit + head)
                log.warning("offload: %s; the rest run on the CPU", reasons[-1])
            if n == 0:
                placement = Placement([], [-1] * n_layer)
            return Offload(placement, output_device, n_layer, reasons, needs)
    raise AssertionError("unreachable: zero layers always fit")


def device_table(endpoints: Sequence[str] = (), timeout: float = HANDSHAKE_TIMEOUT) -> dict:
    """The local CPU, the local GPUs and every RPC server's devices, with their free
    memory, and how each GPU module loaded (elelem info --devices)."""
    gpus, modules = gpu_devices()
    rows = []
    for dev in [cpu_device()] + gpus + connect_servers(endpoints, timeout):
        free, total = dev.memory()
        rows.append({"name": dev.name, "kind": dev.kind, "backend": dev.backend, "description": dev.description,
                     "endpoint": dev.endpoint, "buffer_type": dev.buffer_type,
                     "free_bytes": free, "total_bytes": total})
    return {"devices": rows,
            "modules": [{"backend": m.backend, "state": m.state, "devices": m.n_devices, "note": m.reason}
                        for m in modules],
            "memory_limit_bytes": memory_limit()}
