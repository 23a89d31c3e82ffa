"""GPU offload through a real GPU API, on the CPU: ggml's Vulkan
backend on Mesa's lavapipe ("llvmpipe"), a Vulkan driver that runs on the CPU.

The same per-layer placement serves CUDA, Vulkan and RPC devices, so what
these tests prove of the placement, the K/V per device, the output head,
the memory fit and the fallbacks holds for CUDA too; only speed needs a
real GPU (scripts/device_check.py).

Each case runs in a child process (tests/support/vulkan_child.py): ggml-vulkan
picks its devices once, when its module loads, and lavapipe counts only
when GGML_VK_VISIBLE_DEVICES names it -- which this test process must not
do, or every other test's LLM() would run on it.

The models are tiny synthetic GGUFs (tests/support/synthetic.py): lavapipe runs a
SmolLM2-sized model at under a token per second.  The GPU's kernels round
differently from the CPU's, so the tokens are compared teacher-forced: the
CPU's greedy tokens are forced through the GPU run, and at each step the
GPU's logits must be within RELATIVE_TOLERANCE of the CPU's (of the largest
logit), and the GPU's
greedy choice may differ from the CPU's only where the CPU's top two logits
are closer than the two runs differ.
"""
from __future__ import annotations

import json
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
from elelem.api.devices import Placement
from elelem.errors import DeviceError
from structured_models import TOKENS, write_structured_model
from synthetic import TinyConfig

HERE = Path(__file__).parent
PACKAGE_ROOT = Path(elelem.__file__).resolve().parent.parent
VULKAN_MODULE = Path(_core.LIB_DIR) / "libggml-vulkan.so"
LAVAPIPE = {"GGML_VK_VISIBLE_DEVICES": "0"}
# f32 weights; ggml-vulkan's matmuls round their inputs to f16 where the CPU's keep f32: the
# logits differ by up to 5e-4 to 7e-4 of the largest logit, measured on lavapipe (1.6e-3 of 3.1,
# 1.8e-2 of 26.7), about f16's rounding.  The bound: 4x that.
RELATIVE_TOLERANCE = 3e-3
FOUR_LAYERS = TinyConfig(n_layer=4, n_ctx_train=512, n_vocab=128)
PROMPT = [3, 17, 42, 9, 77, 5, 61, 23]

needs_vulkan = pytest.mark.skipif(
    not VULKAN_MODULE.is_file(),
    reason=f"this elelem was built without the Vulkan module ({VULKAN_MODULE.name}): "
           "ELELEM_VULKAN=1 python setup.py build_ext --inplace (docs/install.md)")


def child(scenario: str, path, options=None, env=None, timeout=600) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("GGML_VK_VISIBLE_DEVICES", offload.MEMORY_LIMIT_ENV)}
    environment.update(PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT), str(HERE),
                                                                environment.get("PYTHONPATH")])))
    environment.update(env or {})
    result = subprocess.run([sys.executable, str(HERE / "support" / "vulkan_child.py"), scenario, str(path),
                             json.dumps(options or {})], cwd=HERE, env=environment, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"the child failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_forced(facts: dict, tolerance: float = RELATIVE_TOLERANCE) -> float:
    """Teacher-forced comparison; returns the largest logit difference."""
    cpu, gpu = np.array(facts["reference"]), np.array(facts["forced"])
    assert cpu.shape == gpu.shape
    gap = float(np.abs(cpu - gpu).max())
    scale = float(np.abs(cpu).max())
    assert gap <= tolerance * scale, f"the GPU's logits are {gap:.3g} from the CPU's (largest: {scale:.3g})"
    print(f"largest logit difference, Vulkan (lavapipe) against the CPU: {gap:.3g} of {scale:.3g}")
    for step, (c, g) in enumerate(zip(cpu, gpu)):
        if int(np.argmax(g)) != int(np.argmax(c)):
            top2 = np.sort(c)[-2:]
            assert top2[1] - top2[0] <= 2 * gap, f"step {step}: the GPU chose otherwise at a CPU margin of " \
                                                 f"{top2[1] - top2[0]:.3g}, more than the runs differ ({gap:.3g})"
    return gap


@pytest.fixture(scope="module")
def four_layers(tiny_model):
    return str(tiny_model(FOUR_LAYERS)[0])


@pytest.fixture(scope="module")
def with_vocabulary(tmp_path_factory):
    """Four layers and a byte-level vocabulary, for the CLI and the server."""
    return str(write_structured_model(tmp_path_factory.mktemp("vulkan") / "vocab.gguf",
                                      FOUR_LAYERS.but(n_vocab=len(TOKENS))))


# -- every layer on lavapipe ---------------------------------------------------


@needs_vulkan
@pytest.mark.parametrize("flash_attn", [False, True], ids=["softmax", "flash-attn"])
def test_every_layer_on_vulkan_gives_the_cpus_tokens_teacher_forced(four_layers, flash_attn):
    facts = child("forced", four_layers, {"prompt": PROMPT, "n": 12, "flash_attn": flash_attn}, LAVAPIPE)
    assert facts["summary"] == "4/4 layers on Vulkan0, output on Vulkan0"
    assert facts["layer_device"] == [0, 0, 0, 0] and facts["output_device"] == 0
    assert facts["backends"] == ["Vulkan0", "CPU"]
    assert facts["kv_buffers"] == ["Vulkan0"] * 4                      # each layer's K/V on its device
    assert facts["flash_attn"] is flash_attn
    check_forced(facts)
    assert any("offload: 4/4 layers on Vulkan0" in line for line in facts["log"])


@needs_vulkan
def test_quantized_kv_cache_on_the_device(tiny_model):
    path = str(tiny_model(FOUR_LAYERS.but(n_embd=128))[0])      # heads of 32: whole Q8_0 blocks
    facts = child("forced", path, {"prompt": PROMPT, "n": 6, "kv_type": "q8_0", "flash_attn": True}, LAVAPIPE)
    assert facts["kv_buffers"] == ["Vulkan0"] * 4
    # The CPU's flash attention quantizes Q to Q8_0 for its dot products with a Q8_0 K; ggml-vulkan's
    # dequantizes K instead: 2.1e-2 of 3.4 measured.
    check_forced(facts, tolerance=1.5e-2)


@needs_vulkan
def test_partial_offload_keeps_the_first_layers_and_the_output_on_the_cpu(four_layers):
    facts = child("forced", four_layers, {"prompt": PROMPT, "n": 8, "n_gpu_layers": 2}, LAVAPIPE)
    assert facts["summary"] == "2/4 layers on Vulkan0"
    assert facts["layer_device"] == [-1, -1, 0, 0] and facts["output_device"] == -1   # llama.cpp's order
    assert facts["kv_buffers"] == ["CPU", "CPU", "Vulkan0", "Vulkan0"]
    check_forced(facts)


@needs_vulkan
def test_n_gpu_layers_equal_to_n_layer_leaves_the_output_head_on_the_cpu(four_layers):
    facts = child("open", four_layers, {"n_gpu_layers": 4}, LAVAPIPE)
    assert facts["summary"] == "4/4 layers on Vulkan0" and facts["output_device"] == -1


@needs_vulkan
def test_batched_streams_a_fork_and_a_trim_on_vulkan(four_layers):
    out = child("streams", four_layers, {"a": PROMPT, "b": PROMPT[::-1][:5]}, LAVAPIPE)
    assert out["facts"]["summary"] == "4/4 layers on Vulkan0, output on Vulkan0"
    cpu, gpu = np.array(out["cpu"]), np.array(out["gpu"])
    assert cpu.shape == gpu.shape == (7, FOUR_LAYERS.n_vocab)
    assert np.abs(cpu - gpu).max() <= RELATIVE_TOLERANCE * np.abs(cpu).max()
    assert (cpu.argmax(axis=1) == gpu.argmax(axis=1)).all()


@needs_vulkan
@pytest.mark.parametrize("arch, options", [("llama", {}), ("gemma3", {"n_swa": 16}), ("qwen3moe", {}),
                                           ("qwen35", {"n_layer": 4})], ids=["llama", "gemma3", "moe", "hybrid"])
def test_the_other_architecture_families_on_vulkan(tiny_model, arch, options):
    """SmolLM2's and Gemma 3's families, experts (ggml_mul_mat_id) and a Gated DeltaNet hybrid,
    whose recurrent state lives beside the K/V: every layer on lavapipe, forced through the CPU's tokens."""
    cfg = TinyConfig(arch=arch, n_vocab=128, n_ctx_train=512, **options)
    facts = child("forced", str(tiny_model(cfg)[0]), {"prompt": PROMPT, "n": 8}, LAVAPIPE)
    assert facts["summary"] == f"{cfg.n_layer}/{cfg.n_layer} layers on Vulkan0, output on Vulkan0"
    check_forced(facts)


@needs_vulkan
def test_speculation_states_grammars_and_the_prompt_cache_on_vulkan(with_vocabulary, tmp_path):
    out = child("features", with_vocabulary, {"cache": str(tmp_path / "prompt-cache-")}, LAVAPIPE)
    cpu, gpu = out["cpu"], out["gpu"]
    assert gpu["summary"] == "4/4 layers on Vulkan0, output on Vulkan0"
    assert gpu["speculative"] == gpu["plain"] == cpu["plain"]      # drafted tokens verified on the GPU
    assert gpu["state_same"] and gpu["grammar"] in ("yes", "no")
    assert gpu["loaded_first"] == 0 and gpu["loaded_second"] >= 128  # K/V read from the device, and written back
    assert gpu["cached_second"] == gpu["cached_first"]


@needs_vulkan
def test_embeddings_on_vulkan(tmp_path):
    from synthetic_bert import BertConfig, write_bert
    write_bert(tmp_path / "bert.gguf", BertConfig())
    out = child("embeddings", tmp_path / "bert.gguf", {"texts": ["hello world", "a cat sleeps"]}, LAVAPIPE)
    assert out["gpu_summary"] == "2/2 layers on Vulkan0"                 # an encoder: no output head
    cpu, gpu = np.array(out["cpu"]), np.array(out["gpu"])
    assert np.abs(cpu - gpu).max() <= RELATIVE_TOLERANCE * np.abs(cpu).max()   # measured: 7e-4 of 2.1


@needs_vulkan
def test_tied_output_head_is_copied_to_the_device(tiny_model):
    path = str(tiny_model(FOUR_LAYERS.but(tied=True))[0])
    facts = child("forced", path, {"prompt": PROMPT, "n": 6}, LAVAPIPE)
    assert facts["output_device"] == 0
    check_forced(facts)


@needs_vulkan
def test_a_weight_the_device_cannot_hold_keeps_the_output_head_on_the_cpu(tiny_model):
    """lavapipe takes no tensor over 128 MiB in one buffer (its maxStorageBufferRange), and ggml's
    scheduler would abort on a weight placed where its op cannot run: a 156 MiB tied head stays
    on the CPU, as llama.cpp keeps such weights there, and the log says why."""
    cfg = TinyConfig(n_layer=2, n_vocab=40000, n_embd=1024, n_head=8, n_head_kv=4, n_ff=256, tied=True,
                     n_ctx_train=512)
    facts = child("forced", str(tiny_model(cfg)[0]), {"prompt": PROMPT, "n": 3}, LAVAPIPE)
    assert facts["summary"] == "2/2 layers on Vulkan0" and facts["output_device"] == -1
    assert any(line.startswith("WARNING") and "the output head stays on the CPU: Vulkan0 cannot hold or multiply "
               "token_embd.weight (156 MiB)" in line for line in facts["log"]), facts["log"]
    check_forced(facts)


@needs_vulkan
@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm_path", "gemma_path", "qwen_path"])
def test_the_packaged_models_on_vulkan_teacher_forced(model, request):
    """The three packaged models with every layer on lavapipe against the CPU, forced through the
    CPU's greedy tokens after a text prompt.  Their quantized weights round otherwise on the GPU
    (ggml-vulkan's matmuls take f16 activations; the CPU's dot products Q8 ones): measured, the
    logits differ by up to 6% of the largest one (Gemma 3: 1.2 of 22.0; SmolLM2: 1.3 of 20.3;
    Qwen2.5-Coder: 0.57 of 20.9; correlation over 0.998 at every step), and the 9 greedy choices
    were the CPU's.  The bound: 10%, and a choice of its own only at a CPU margin within twice
    the difference.  Gemma 3's and Qwen2.5's tied heads (170 and 144 MiB) are over lavapipe's
    128 MiB buffer limit, so their heads stay on the CPU."""
    facts = child("forced", request.getfixturevalue(model),
                  {"text": "The capital of France is Paris. The capital of Germany is", "n": 8}, LAVAPIPE, timeout=900)
    n_layer = len(facts["layer_device"])
    assert facts["summary"].startswith(f"{n_layer}/{n_layer} layers on Vulkan0")
    check_forced(facts, tolerance=0.10)


# -- memory --------------------------------------------------------------------


@needs_vulkan
def test_a_memory_limit_keeps_the_layers_that_do_not_fit_on_the_cpu(four_layers):
    facts = child("memory_limit", four_layers, {"fit": 2}, LAVAPIPE)
    assert facts["summary"] == "2/4 layers on Vulkan0"
    assert facts["layer_device"] == [-1, -1, 0, 0]
    warnings = [line for line in facts["log"] if line.startswith("WARNING") and "too little memory" in line]
    assert len(warnings) == 1, facts["log"]
    assert "2 of 4 layers fit in Vulkan0's" in warnings[0] and "ELELEM_GPU_MEMORY_LIMIT" in warnings[0]


@needs_vulkan
def test_the_estimate_covers_what_the_scheduler_reserved(four_layers):
    facts = child("open", four_layers, {"flash_attn": False}, LAVAPIPE)
    reserved = facts["compute"]["Vulkan0"]
    assert 0 < reserved <= facts["compute_estimate"], (reserved, facts["compute_estimate"])
    assert facts["estimate"]["Vulkan0"] > facts["compute_estimate"] + offload.HEADROOM_BYTES  # + weights and K/V
    print(f"compute buffer on Vulkan0: {reserved} bytes reserved, {facts['compute_estimate']} estimated")


# -- fallbacks that say so -------------------------------------------------------


@needs_vulkan
def test_lavapipe_unnamed_means_no_gpu_logged_and_explicit_layers_an_error(four_layers):
    facts = child("open", four_layers, {})
    assert facts["summary"] == "0/4 layers on a GPU (CPU)" and facts["backends"] == ["CPU"]
    assert any("no GPU" in line and "Vulkan found no device" in line for line in facts["log"]), facts["log"]
    error = child("open", four_layers, {"n_gpu_layers": -1})
    assert error["error"] == "DeviceError" and "no GPU" in error["message"] and "n_gpu_layers=0" in error["message"]


@needs_vulkan
def test_a_device_that_is_not_there(four_layers):
    missing = {"GGML_VK_VISIBLE_DEVICES": "7"}          # ggml-vulkan's backend then refuses to start
    facts = child("open", four_layers, {}, missing)
    assert facts["summary"].endswith("(CPU)")
    assert any("did not start" in line for line in facts["log"]), facts["log"]
    error = child("open", four_layers, {"n_gpu_layers": 2}, missing)
    assert error["error"] == "DeviceError" and "did not start" in error["message"]
    error = child("open", four_layers, {"main_gpu": 3}, LAVAPIPE)
    assert error["error"] == "DeviceError" and "main_gpu=3, but there are 1 GPUs" in error["message"]


def test_a_module_that_cannot_load(four_layers, tmp_path):
    (tmp_path / "libggml-vulkan.so").write_bytes(b"\x7fELF but not really a module")
    facts = child("broken_module", four_layers, {"lib_dir": str(tmp_path), "llm": {}}, LAVAPIPE)
    vulkan = next(m for m in facts["modules"] if m["backend"] == "Vulkan")
    assert vulkan["state"] == "failed" and "could not be loaded" in vulkan["reason"]
    assert next(m for m in facts["modules"] if m["backend"] == "CUDA")["state"] == "absent"
    assert facts["summary"].endswith("(CPU)")
    assert any("no GPU" in line and "could not be loaded" in line for line in facts["log"])
    error = child("broken_module", four_layers, {"lib_dir": str(tmp_path), "llm": {"tensor_split": [1]}}, LAVAPIPE)
    assert error["error"] == "DeviceError" and "could not be loaded" in error["message"]


def test_what_ggml_says_while_a_module_loads_is_the_reason(tmp_path, monkeypatch):
    """ggml-cuda registers no device when the driver is too old, and says why only in its log
    ("failed to initialize CUDA: CUDA driver version is insufficient ..."): the reason keeps it."""
    (tmp_path / "libggml-cuda.so").write_bytes(b"")

    def load(path):
        logging.getLogger("elelem.ggml").error("ggml_cuda_init: failed to initialize CUDA: CUDA driver version is "
                                               "insufficient for CUDA runtime version")
        return 0

    monkeypatch.setattr(offload, "load_gpu_module", load)
    cuda = next(m for m in offload.load_gpu_modules(str(tmp_path)) if m.backend == "CUDA")
    assert cuda.state == "loaded" and cuda.n_devices == 0
    assert cuda.reason == ("CUDA found no device it can use (ggml: ggml_cuda_init: failed to initialize CUDA: CUDA "
                           "driver version is insufficient for CUDA runtime version)")


def test_n_gpu_layers_zero_is_the_cpu_without_looking_for_a_gpu(caplog):
    with caplog.at_level(logging.INFO, logger="elelem"):
        plan = offload.plan_offload(4, [1] * 4, 1, 1, {"n_embd": 8, "n_vocab": 8}, 8, 256, False, n_gpu_layers=0,
                                    devices=[])
    assert plan.placement.layer_device == [-1] * 4 and plan.summary == "0/4 layers on a GPU (CPU)"
    assert "n_gpu_layers=0" in caplog.text


# -- the split and the memory fit, without a device ------------------------------------


class FakeGPU:
    def __init__(self, name, free):
        self.name, self.description, self.backend, self._free = name, name + " card", "Vulkan", free

    def memory(self):
        return self._free, self._free


HP = {"n_embd": 64, "n_ff": 128, "n_head": 4, "head_dim_k": 16, "n_vocab": 1000}


def fit(free, n_gpu_layers=None, tensor_split=None, devices=None, layer=1000, kv=100, output=5000):
    return offload.plan_offload(8, [layer] * 8, output, kv, HP, 32, 256, False, n_gpu_layers=n_gpu_layers,
                                tensor_split=tensor_split, devices=devices or [FakeGPU("GPU0", free)], modules=[])


def base(with_output=True):
    return offload.compute_bytes(HP, 32, 256, False, with_output) + offload.HEADROOM_BYTES


def test_the_fit_counts_layers_kv_output_and_compute(monkeypatch):
    monkeypatch.delenv(offload.MEMORY_LIMIT_ENV, raising=False)
    everything = base() + 8 * 1100 + 5000
    assert fit(everything).summary == "8/8 layers on GPU0, output on GPU0"
    plan = fit(everything - 1)            # one byte short: the output head stays on the CPU
    assert plan.summary == "8/8 layers on GPU0" and "too little memory: 8 of 8" in plan.reasons[0]
    plan = fit(base(False) + 3 * 1100)    # three layers' weights and K/V
    assert plan.placement.layer_device == [-1] * 5 + [0] * 3
    assert fit(base(False) - 1).summary == "0/8 layers on a GPU (CPU)"
    assert fit(10**12, n_gpu_layers=3).placement.layer_device == [-1] * 5 + [0] * 3
    assert fit(10**12, n_gpu_layers=9).output_device == 0      # n_layer + 1: the output too, as llama.cpp
    monkeypatch.setenv(offload.MEMORY_LIMIT_ENV, str(base(False) + 2 * 1100))
    assert fit(10**12).placement.layer_device == [-1] * 6 + [0] * 2


def test_main_gpu_and_tensor_split_choose_the_devices(monkeypatch):
    monkeypatch.delenv(offload.MEMORY_LIMIT_ENV, raising=False)
    a, b = FakeGPU("GPU0", 10**12), FakeGPU("GPU1", 10**12)
    assert fit(0, devices=[a, b]).summary == "8/8 layers on GPU0, output on GPU0"      # the best one only
    plan = offload.plan_offload(8, [1000] * 8, 5000, 100, HP, 32, 256, False, main_gpu=1, devices=[a, b], modules=[])
    assert plan.summary == "8/8 layers on GPU1, output on GPU1"
    plan = fit(0, tensor_split=[1, 3], devices=[a, b])
    assert plan.placement.layer_device == [0] * 2 + [1] * 6 and plan.output_device == 1
    with pytest.raises(DeviceError, match="main_gpu=2"):
        offload.plan_offload(8, [1] * 8, 1, 1, HP, 32, 256, False, main_gpu=2, devices=[a, b], modules=[])


def test_memory_limit_parsing(monkeypatch):
    for text, value in (("1000", 1000), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)), ("2g", 2 * 2**30)):
        monkeypatch.setenv(offload.MEMORY_LIMIT_ENV, text)
        assert offload.memory_limit() == value
    monkeypatch.setenv(offload.MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(elelem.errors.InvalidArgumentError, match="ELELEM_GPU_MEMORY_LIMIT"):
        offload.memory_limit()


# -- the CLI and the server -----------------------------------------------------------


@needs_vulkan
def test_info_devices_lists_lavapipe_and_the_modules(four_layers):
    env = {k: v for k, v in os.environ.items() if k != offload.MEMORY_LIMIT_ENV}
    env.update(LAVAPIPE, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "elelem", "info", "--devices", "--json"], cwd=HERE, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    assert [(d["name"], d["backend"]) for d in table["devices"]] == [("CPU", "CPU"), ("Vulkan0", "Vulkan")]
    assert "llvmpipe" in table["devices"][1]["description"] and table["devices"][1]["free_bytes"] > 0
    assert {m["backend"]: m["state"] for m in table["modules"]}["Vulkan"] == "loaded"
    text = subprocess.run([sys.executable, "-m", "elelem", "info", "--devices"], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "Vulkan module: loaded, 1 device(s)" in text.stdout and "CUDA module: not built" in text.stdout


@needs_vulkan
def test_run_with_n_gpu_layers_on_the_command_line(with_vocabulary):
    env = {k: v for k, v in os.environ.items() if k != offload.MEMORY_LIMIT_ENV}
    env.update(LAVAPIPE, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-m", "elelem", "run", "-m", with_vocabulary, "-t", "1", "-n", "3",
                             "--raw", "--temperature", "0", "-ngl", "3", "-v", "hi"],
                            cwd=HERE, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "offload: 3/4 layers on Vulkan0" in result.stderr


@needs_vulkan
def test_serve_reports_the_offload_in_health_and_metrics(with_vocabulary):
    out = child("server", with_vocabulary, {}, LAVAPIPE)
    assert out["completion_status"] == 200
    assert list(out["health"]["offload"].values()) == ["4/4 layers on Vulkan0, output on Vulkan0"]
    assert any(line.startswith("elelem_model_gpu_layers{") and line.endswith(" 4") for line in out["metrics"])
    assert any(line.startswith("elelem_model_layers{") and line.endswith(" 4") for line in out["metrics"])
    assert any("loaded" in line and "4/4 layers on Vulkan0" in line for line in out["log"])


def test_compat_llama_keeps_llama_cpp_pythons_cpu_fallback(four_layers):
    """llama-cpp-python scripts pass n_gpu_layers=-1 anywhere: the shim runs them on the CPU, with a warning."""
    out = child("compat", four_layers, {"n_gpu_layers": -1})
    assert out["summary"].endswith("(CPU)") and out["flash_attn"] is False
    assert any(line.startswith("WARNING") and "n_gpu_layers=-1: no GPU" in line for line in out["log"])
