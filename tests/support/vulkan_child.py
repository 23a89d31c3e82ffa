"""The Vulkan tests' child process (tests/test_vulkan.py).

ggml's Vulkan backend chooses its devices once, when its module loads, from
GGML_VK_VISIBLE_DEVICES: lavapipe (Mesa's Vulkan on the CPU) is seen only
when that names it.  So each scenario runs here, in a process of its own with
the variable set as the test wants, and prints one JSON line with what it
found; the test asserts on it.

    python vulkan_child.py SCENARIO MODEL.gguf [JSON options]
"""
from __future__ import annotations

import json
import logging
import sys

import numpy as np


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.levelname} {record.name}: {record.getMessage()}")


RECORDS = Records()
logging.getLogger("elelem").addHandler(RECORDS)
logging.getLogger("elelem").setLevel(logging.DEBUG)

from elelem import LLM  # noqa: E402  (after the log handler: the loading logs too)
from elelem.api import offload as offload_module  # noqa: E402
from elelem.errors import ElelemError  # noqa: E402


def describe(llm) -> dict:
    context = llm.engine.context
    return {"summary": llm.offload.summary, "offload": llm.offload.as_dict(),
            "layer_device": list(llm.placement.layer_device), "output_device": llm.offload.output_device,
            "backends": context.backend_names, "kv_buffers": context.cache.layer_buffer_types(),
            "flash_attn": bool(context.flash_attn), "compute": context.compute_buffer_sizes(),
            "estimate": llm.offload.estimate,
            "compute_estimate": offload_module.compute_bytes(llm.hparams, 512, context.kv_size, bool(context.flash_attn),
                                                             llm.offload.output_device >= 0)}


def teacher_forced(llm, prompt: list[int], forced: list[int]) -> list[list[float]]:
    """The logits after the prompt (one step) and after each forced token (a step each)."""
    context = llm.engine.context
    rows = [context.decode(prompt, [0] * len(prompt))[-1]]
    for token in forced:
        rows.append(context.decode([token], [0], decode_kernels=True)[-1])
    return [list(map(float, r)) for r in rows]


def greedy(llm, prompt: list[int], n: int) -> list[int]:
    context = llm.engine.context
    logits = context.decode(prompt, [0] * len(prompt))[-1]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = context.decode([out[-1]], [0], decode_kernels=True)[-1]
    return out


def scenario_forced(path, o):
    """Greedy tokens on the CPU, then the same tokens forced through the GPU run."""
    prompt, n = o.get("prompt"), o["n"]
    common = dict(n_ctx=256, n_threads=1, repack=False, flash_attn=o.get("flash_attn", False),
                  kv_type=o.get("kv_type", "f16"))
    with LLM(path, n_gpu_layers=0, **common) as cpu:
        if prompt is None:     # a text, as the model's tokenizer makes it (with its BOS)
            prompt = cpu.tokenize(o["text"])
        tokens = greedy(cpu, prompt, n)
        cpu.engine.context.seq_rm(0)
        reference = teacher_forced(cpu, prompt, tokens[:-1])
    with LLM(path, n_gpu_layers=o.get("n_gpu_layers"), **common) as gpu:
        facts = describe(gpu)
        facts["forced"] = teacher_forced(gpu, prompt, tokens[:-1])
    facts.update(tokens=tokens, reference=reference)
    return facts


def scenario_streams(path, o):
    """Two sequences in one step, a fork (seq_cp) and a trim (seq_rm): the same on the GPU as on the CPU."""
    a, b = o["a"], o["b"]
    out = {}
    for label, n_gpu_layers in (("cpu", 0), ("gpu", o.get("n_gpu_layers"))):
        with LLM(path, n_ctx=256, n_threads=1, repack=False, flash_attn=o.get("flash_attn", False),
                 n_gpu_layers=n_gpu_layers) as llm:
            ctx = llm.engine.context
            rows = []
            tokens = a + b
            seqs = [0] * len(a) + [1] * len(b)
            flags = np.zeros(len(tokens), dtype=bool)
            flags[len(a) - 1] = flags[-1] = True
            rows += list(ctx.decode(tokens, seqs, flags))                         # two prompts, one step
            rows += list(ctx.decode([5, 6], [0, 1], decode_kernels=True))         # one token each, one step
            ctx.seq_cp(0, 2)                                                      # fork sequence 0
            rows += list(ctx.decode([7, 8], [0, 2], decode_kernels=True))         # both branches go on
            ctx.seq_rm(0, len(a))                                                 # trim 0 back to its prompt
            rows += list(ctx.decode([9], [0], decode_kernels=True))
            if label == "gpu":
                out["facts"] = describe(llm)
            out[label] = [list(map(float, r)) for r in rows]
    return out


def scenario_open(path, o):
    """Open with these options; the offload, or the error, and the log."""
    try:
        with LLM(path, n_ctx=128, n_threads=1, **o) as llm:
            facts = describe(llm)
            facts["text_tokens"] = greedy(llm, [1, 2, 3], 3)
            return facts
    except ElelemError as error:
        return {"error": type(error).__name__, "message": str(error)}


def scenario_broken_module(path, o):
    """GPU modules taken from a folder holding a file that is no module."""
    offload_module.lib_dir = lambda: o["lib_dir"]
    return {"modules": [m.__dict__ for m in offload_module.load_gpu_modules()], **scenario_open(path, o["llm"])}


def scenario_memory_limit(path, o):
    """A memory limit that fits ``o["fit"]`` layers and not the output head, by the estimate (n_ctx 128: 256 cells)."""
    import os
    from elelem.api.devices import kv_layer_bytes
    with LLM(path, n_ctx=128, n_threads=1, n_gpu_layers=0) as probe:
        h, spec, gguf = probe.hparams, probe.spec, probe.gguf
        layer_bytes = [sum(gguf.tensors[n].nbytes for n in t.values() if n) for t in spec.layer_tensors]
    kv = kv_layer_bytes(256, h["n_head_kv"], h["head_dim_k"], h["head_dim_v"], "f16", "f16")
    fit = o["fit"]
    need = (sum(layer_bytes[-fit:]) + fit * kv + offload_module.HEADROOM_BYTES
            + offload_module.compute_bytes(h, 512, 256, False, False))
    os.environ[offload_module.MEMORY_LIMIT_ENV] = str(need + 1)
    facts = scenario_open(path, {"flash_attn": False})
    facts["limit"] = need + 1
    return facts


def scenario_features(path, o):
    """What sits above the backend, with every layer on the GPU: speculative decoding, a saved
    state, a grammar, the prompt cache on disk; each also on the CPU."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 5 + "The quick brown fox"   # 200+ tokens
    out = {}
    for label, layers in (("cpu", 0), ("gpu", None)):
        r = out[label] = {}
        common = dict(n_ctx=1024, n_threads=1, n_gpu_layers=layers, flash_attn=False)
        with LLM(path, speculative=True, **common) as llm:
            r["summary"] = llm.offload.summary
            r["speculative"] = llm.generate(prompt, max_tokens=16, temperature=0)
            llm.reset()
            llm.eval(llm.tokenize(prompt))
            state = llm.save_state()
            after = llm.eval([5])
            llm.load_state(state)
            r["state_same"] = bool(np.array_equal(after, llm.eval([5])))
            r["grammar"] = llm.generate(prompt, max_tokens=4, temperature=0, grammar='root ::= "yes" | "no"')
        with LLM(path, speculative=False, **common) as llm:
            r["plain"] = llm.generate(prompt, max_tokens=16, temperature=0)
        for run in ("first", "second"):     # the second process-like run loads the first one's prefix
            with LLM(path, speculative=False, prompt_cache=o["cache"] + label, **common) as llm:
                r[f"cached_{run}"] = llm.generate(prompt + " again", max_tokens=8, temperature=0)
                r[f"loaded_{run}"] = llm.engine.prompt_cache.loaded_tokens
    return out


def scenario_embeddings(path, o):
    out = {}
    for label, layers in (("cpu", 0), ("gpu", None)):
        with LLM(path, n_ctx=64, n_threads=1, n_gpu_layers=layers) as llm:
            out[label] = [list(map(float, v)) for v in llm.embed(o["texts"])]
            out[label + "_summary"] = llm.offload.summary
    return out


def scenario_compat(path, o):
    from elelem.compat import Llama
    with Llama(model_path=path, n_ctx=128, n_threads=1, verbose=False, **o) as made:
        return describe(made.llm)


def scenario_server(path, o):
    from starlette.testclient import TestClient
    from elelem.server import ServerConfig, create_app
    app = create_app(ServerConfig(models=[path], n_ctx=128, n_threads=1, parallel=2, keep_alive=None,
                                  n_gpu_layers=o.get("n_gpu_layers")))
    with TestClient(app) as client:
        health = client.get("/health").json()
        metrics = client.get("/metrics").text
        answer = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3, "temperature": 0})
    return {"health": health, "metrics": [line for line in metrics.splitlines() if "layers" in line],
            "completion_status": answer.status_code}


def main() -> None:
    scenario, path = sys.argv[1], sys.argv[2]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    result = globals()[f"scenario_{scenario}"](path, options)
    result["log"] = RECORDS.messages
    print(json.dumps(result))


if __name__ == "__main__":
    main()
