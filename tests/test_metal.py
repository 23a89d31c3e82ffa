"""ggml's Metal backend (macOS): the build switches, the CMake configuration,
and the device layer with Metal's names, checked on any machine; the live
offload where this elelem has libggml-metal.so and a Metal GPU (an Apple
Silicon Mac: scripts/device_check_metal.sh runs these there).

Metal's backend calls itself "MTL" and its devices "MTL0", ...: the device
layer finds them by that name, as ggml's registry gives it, not by the
module's file.
"""
from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import elelem
from elelem import _core
from elelem.api import offload
from elelem.errors import DeviceError
from synthetic import TinyConfig, write_model

ROOT = Path(__file__).resolve().parents[1]
METAL_MODULE = Path(_core.LIB_DIR) / "libggml-metal.so"
# Metal's matmuls run in f16/f32 on the GPU; the CPU's keep f32: the same order of
# difference as ggml-vulkan's on lavapipe (tests/test_vulkan.py), and the same bound.
RELATIVE_TOLERANCE = 3e-3


def setup_functions(platform: str) -> dict:
    """setup.py's functions as on ``platform`` ("darwin", "linux"), without its setup() call
    (which would build elelem)."""
    pytest.importorskip("setuptools", reason="setup.py imports setuptools")
    tree = ast.parse((ROOT / "setup.py").read_text())
    tree.body = [node for node in tree.body
                 if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))]
    namespace: dict = {"__file__": str(ROOT / "setup.py")}
    exec(compile(tree, "setup.py", "exec"), namespace)
    namespace["macos"] = lambda: platform == "darwin"   # the functions look it up when called
    return namespace


@pytest.fixture
def setup_py(monkeypatch):
    for name in ("ELELEM_METAL", "CMAKE_ARGS", "ARCHFLAGS", "_PYTHON_HOST_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    return setup_functions


# -- setup.py ---------------------------------------------------------------------------


def test_metal_is_built_by_default_on_macos_only(setup_py, monkeypatch):
    mac, linux = setup_py("darwin"), setup_py("linux")
    assert mac["metal_enabled"]() and mac["gpu_suffix"]() == "-metal"
    assert not linux["metal_enabled"]() and linux["gpu_suffix"]() == ""
    for off in ({"ELELEM_METAL": "0"}, {"CMAKE_ARGS": "-DGGML_METAL=OFF"}, {"CMAKE_ARGS": "-DGGML_METAL:BOOL=off"}):
        with monkeypatch.context() as m:
            for k, v in off.items():
                m.setenv(k, v)
            assert not mac["metal_enabled"](), off
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_METAL=ON")   # llama-cpp-python's spelling: CMake then says why not
    assert linux["metal_enabled"]()


def test_macos_links_through_loader_path_and_passes_archflags(setup_py, monkeypatch):
    mac, linux = setup_py("darwin"), setup_py("linux")
    assert mac["rpath_to_lib_dir"]() == "-Wl,-rpath,@loader_path/_lib"
    assert linux["rpath_to_lib_dir"]() == "-Wl,-rpath,$ORIGIN/_lib"
    monkeypatch.setenv("ARCHFLAGS", "-arch arm64")      # what cibuildwheel sets on macOS
    assert mac["osx_architectures"]() == ["-DCMAKE_OSX_ARCHITECTURES=arm64"]
    assert linux["osx_architectures"]() == []


@pytest.mark.parametrize("platform, kernels", [("macosx-11.0-arm64", ("portable",)),
                                               ("linux-aarch64", ("portable",)),
                                               ("linux-x86_64", ("small_batch",))])
def test_the_kernels_follow_the_target_platform(setup_py, monkeypatch, platform, kernels):
    # cibuildwheel and scripts/arm64_check.sh say the target through _PYTHON_HOST_PLATFORM
    monkeypatch.setenv("_PYTHON_HOST_PLATFORM", platform)
    assert setup_py("linux")["kernel_sources"]()[:len(kernels)] == kernels


def test_a_macos_build_folder_is_installed_under_its_install_names(setup_py, tmp_path):
    built, lib = tmp_path / "built", tmp_path / "pkg" / "_lib"
    built.mkdir()
    for name in ("libggml.0.25.3.dylib", "libggml-base.0.25.3.dylib", "libggml-cpu-apple_m1.so",
                 "libggml-cpu-apple_m2_m3.so", "libggml-rpc.so"):
        (built / name).write_bytes(name.encode())
    for link, target in (("libggml.0.dylib", "libggml.0.25.3.dylib"), ("libggml.dylib", "libggml.0.dylib"),
                         ("libggml-base.0.dylib", "libggml-base.0.25.3.dylib")):
        (built / link).symlink_to(target)
    mac = setup_py("darwin")
    with pytest.raises(SystemExit, match="libggml-metal.so"):   # Metal on, and no module: said, not shipped without
        mac["install_libraries"](built, lib)
    (built / "libggml-metal.so").write_bytes(b"metal")
    linked = mac["install_libraries"](built, lib)
    assert [p.name for p in linked] == ["libggml.0.dylib", "libggml-base.0.dylib"]
    assert (lib / "libggml.0.dylib").read_bytes() == b"libggml.0.25.3.dylib" and not (lib / "libggml.0.dylib").is_symlink()
    assert sorted(p.name for p in lib.iterdir()) == [
        "LICENSE-ggml", "libggml-base.0.dylib", "libggml-cpu-apple_m1.so", "libggml-cpu-apple_m2_m3.so",
        "libggml-metal.so", "libggml-rpc.so", "libggml.0.dylib"]


# -- cmake/metal.cmake ------------------------------------------------------------------


def cmake() -> str:
    try:
        import cmake as cmake_wheel
        return os.path.join(cmake_wheel.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        return "cmake"


def configure_metal(tmp_path, apple: bool, metal: bool) -> subprocess.CompletedProcess:
    """cmake/metal.cmake's macros as cmake/CMakeLists.txt calls them, for a macOS or another target."""
    script = tmp_path / "probe.cmake"
    script.write_text(f"""cmake_minimum_required(VERSION 3.18)
set(APPLE {1 if apple else 0})
set(ELELEM_METAL {'ON' if metal else 'OFF'})
include({(ROOT / 'cmake' / 'metal.cmake').as_posix()})
elelem_configure_metal()
elelem_configure_apple_rpath()
message(STATUS "METAL=${{GGML_METAL}} EMBED=${{GGML_METAL_EMBED_LIBRARY}} BLAS=${{GGML_BLAS}} \
RPATH=${{CMAKE_INSTALL_RPATH}} WITH_INSTALL_RPATH=${{CMAKE_BUILD_WITH_INSTALL_RPATH}}")
""")
    return subprocess.run([cmake(), "-P", str(script)], capture_output=True, text=True, timeout=60)


def test_cmake_embeds_the_shaders_and_keeps_ggmls_blas_off(tmp_path):
    # ggml's own defaults on Apple are Metal and BLAS on: elelem says each, whatever the default
    out = configure_metal(tmp_path, apple=True, metal=True)
    assert out.returncode == 0, out.stderr
    assert "METAL=ON EMBED=ON BLAS=OFF RPATH=@loader_path WITH_INSTALL_RPATH=ON" in out.stdout
    out = configure_metal(tmp_path, apple=True, metal=False)
    assert "METAL=OFF EMBED= BLAS=OFF RPATH=@loader_path" in out.stdout
    out = configure_metal(tmp_path, apple=False, metal=False)   # Linux: nothing changes (ggml's defaults are off)
    assert "METAL=OFF EMBED= BLAS=OFF RPATH= WITH_INSTALL_RPATH=" in out.stdout


def test_cmake_refuses_metal_off_macos(tmp_path):
    out = configure_metal(tmp_path, apple=False, metal=True)
    assert out.returncode != 0 and "ELELEM_METAL=ON needs macOS" in out.stderr


# -- the device layer, with Metal's names ---------------------------------------------


class FakeDevice:
    def __init__(self, name, backend, description, kind="gpu", free=64 * 2**30):
        self.name, self.backend, self.description, self.kind, self._free = name, backend, description, kind, free
        self.device_id = None          # ggml-metal gives no PCI id

    def memory(self):
        return self._free, self._free


@pytest.fixture
def on_a_mac(monkeypatch, tmp_path):
    """The GPU modules a macOS elelem has, loading from tmp_path."""
    monkeypatch.setattr(offload, "GPU_MODULES", offload.gpu_modules("darwin"))
    monkeypatch.setattr(offload, "lib_dir", lambda: str(tmp_path))
    monkeypatch.delenv(offload.MEMORY_LIMIT_ENV, raising=False)
    return tmp_path


def test_metal_is_listed_on_macos_between_cuda_and_vulkan():
    assert [m.backend for m in offload.gpu_modules("darwin")] == ["CUDA", "Metal", "Vulkan"]
    assert [m.backend for m in offload.gpu_modules("linux")] == ["CUDA", "Vulkan"]
    metal = offload.gpu_modules("darwin")[1]
    assert (metal.file, metal.registry) == ("libggml-metal.so", "MTL")


def test_metal_devices_are_found_by_ggmls_name_and_come_before_moltenvk(on_a_mac, monkeypatch):
    (on_a_mac / "libggml-metal.so").write_bytes(b"")
    (on_a_mac / "libggml-vulkan.so").write_bytes(b"")
    monkeypatch.setattr(offload, "load_gpu_module", lambda path: 1)
    mtl, vk = FakeDevice("MTL0", "MTL", "Apple M2 Pro"), FakeDevice("Vulkan0", "Vulkan", "Apple M2 Pro (MoltenVK)")
    cpu = FakeDevice("CPU", "CPU", "Apple M2 Pro", kind="cpu")
    monkeypatch.setattr(offload, "local_devices", lambda: [cpu, vk, mtl])
    devices, modules = offload.gpu_devices()
    assert [d.name for d in devices] == ["MTL0", "Vulkan0"]
    assert {m.backend: m.state for m in modules} == {"CUDA": "absent", "Metal": "loaded", "Vulkan": "loaded"}


def test_every_layer_and_the_output_on_mtl0_by_default(on_a_mac, monkeypatch, caplog):
    (on_a_mac / "libggml-metal.so").write_bytes(b"")
    monkeypatch.setattr(offload, "load_gpu_module", lambda path: 1)
    monkeypatch.setattr(offload, "local_devices", lambda: [FakeDevice("MTL0", "MTL", "Apple M2")])
    with caplog.at_level(logging.INFO, logger="elelem"):
        plan = offload.plan_offload(8, [1000] * 8, 5000, 100, {"n_embd": 64, "n_vocab": 1000}, 32, 256, True)
    assert plan.summary == "8/8 layers on MTL0, output on MTL0"
    assert plan.as_dict()["devices"][0]["backend"] == "MTL"
    assert "offload: 8/8 layers on MTL0, output on MTL0" in caplog.text


def test_a_metal_module_that_does_not_start_is_logged_and_the_cpu_runs(on_a_mac, monkeypatch, caplog):
    (on_a_mac / "libggml-metal.so").write_bytes(b"")

    def load(path):
        raise DeviceError("libggml-metal.so loaded, but its backend did not start")

    monkeypatch.setattr(offload, "load_gpu_module", load)
    monkeypatch.setattr(offload, "local_devices", lambda: [])
    with caplog.at_level(logging.INFO, logger="elelem"):
        plan = offload.plan_offload(8, [1] * 8, 1, 1, {"n_embd": 8, "n_vocab": 8}, 8, 256, False)
    assert plan.summary == "0/8 layers on a GPU (CPU)"
    assert "did not start (no Metal device: a Mac without a Metal GPU" in plan.reasons[0]
    assert "offload: every layer on the CPU: no GPU" in caplog.text and "no Metal device" in caplog.text
    with pytest.raises(DeviceError, match="no Metal device"):     # asked for in so many words: an error
        offload.plan_offload(8, [1] * 8, 1, 1, {"n_embd": 8, "n_vocab": 8}, 8, 256, False, n_gpu_layers=4)


def test_a_metal_module_that_cannot_be_opened_says_the_loaders_words(on_a_mac, monkeypatch):
    (on_a_mac / "libggml-metal.so").write_bytes(b"not a Mach-O file")
    metal = next(m for m in offload.load_gpu_modules() if m.backend == "Metal")
    assert metal.state == "failed" and metal.reason.startswith("libggml-metal.so could not be loaded: ")


# -- live, on a Mac with a Metal GPU ----------------------------------------------------------

needs_metal = pytest.mark.skipif(
    sys.platform != "darwin" or not METAL_MODULE.is_file(),
    reason=f"needs macOS and this elelem's {METAL_MODULE.name} (built by default on macOS)")


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    path = tmp_path_factory.mktemp("metal") / "four.gguf"
    write_model(path, TinyConfig(n_layer=4, n_ctx_train=512, n_vocab=128))
    return str(path)


@pytest.mark.hardware   # an Apple GPU: no Linux CI machine has one
@needs_metal
@pytest.mark.parametrize("flash_attn", [False, True])
def test_every_layer_on_metal_gives_the_cpus_tokens_teacher_forced(four_layers, flash_attn):
    prompt = [3, 17, 42, 9, 77, 5, 61, 23]
    with elelem.LLM(four_layers, n_gpu_layers=0, flash_attn=flash_attn) as llm:
        cpu = llm.eval(prompt, all_logits=True)
        tokens = list(map(int, llm.generate_tokens(prompt, 8)))
    with elelem.LLM(four_layers, flash_attn=flash_attn) as llm:          # the default: every layer on the GPU
        assert llm.offload.summary == "4/4 layers on MTL0, output on MTL0"
        gpu = llm.eval(prompt, all_logits=True)
        forced = llm.eval(prompt + tokens, all_logits=True)
    with elelem.LLM(four_layers, n_gpu_layers=0, flash_attn=flash_attn) as llm:
        cpu_forced = llm.eval(prompt + tokens, all_logits=True)
    scale = np.abs(cpu).max()
    assert np.abs(gpu - cpu).max() <= RELATIVE_TOLERANCE * scale
    gap = np.abs(forced - cpu_forced).max()
    assert gap <= RELATIVE_TOLERANCE * np.abs(cpu_forced).max()
    for step in np.nonzero(forced.argmax(1) != cpu_forced.argmax(1))[0]:   # only where the CPU's top two are a near tie
        top = np.sort(cpu_forced[step])[-2:]
        assert top[1] - top[0] <= 2 * gap, step
