#!/usr/bin/env python3
"""Image encoding time, elelem against libmtmd (llama-cpp-python's), on a Gemma-3-, Qwen2.5-VL- or Mistral-Small-3.1-shaped projector.

    python benchmarks/vision.py --llama-python "$(python scripts/reference_llamacpp.py --check)" \
        [--projector gemma3|qwen25vl|pixtral] [--layers N] [--repeats 3] [--threads 2] [--flash-attn on|off]

``--projector pixtral``: Mistral Small 3.1's encoder shapes (width 1024, 16 heads, gated SiLU FFN
4096, 24 layers, 14 x 14 patches, the 2 x 2 patch merger), F16; the 1024 x 768 image is sized to
1036 x 756 (3996 patches, 999 tokens and 26 [IMG_BREAK] rows); the adapter projects to a 256-wide
synthetic mistral3 text model.

``--projector qwen25vl``: Qwen2.5-VL's encoder shapes (width 1280, 16 heads, gated FFN 3420, 32
layers of which every 8th attends fully and the others within 112-pixel windows, 14 x 14 patches
merged 2 x 2), F16; the 1024 x 768 image is smart-resized to 1036 x 756 (3996 patches, 999
tokens); the merger projects to a 256-wide synthetic qwen2vl text model.

The gemma3 projector: Gemma 3's SigLIP shapes (width 1152, 16 heads, FFN 4304, 896 x 896 pixels in
14 x 14 patches: 4096 patches, pooled to 256 tokens), F16 as the converter writes it, with
``--layers`` of its 27 layers (the cost is per layer), projecting to a 256-wide synthetic gemma3
text model (libmtmd wants a text model of the projector's width; the projection is a small part
of the cost).  The image: a 1024 x 768 screenshot-like picture, as raw pixels on both sides, so
the time is preprocessing and encoding.  Each engine encodes it ``--repeats`` times in its own
process (elelem's embeddings cache off); the best time is printed, and whether the two gave the
same embeddings.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
sys.path.insert(0, str(REPO / "tests" / "support" / "fixtures"))

LLAMACPP_WORKER = r"""
import ctypes, json, sys, time
import numpy as np
import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
from make_vision_fixtures import FLASH_ATTN, bitmap, tokenize
from reference_run import open_llama
model, mmproj, image, threads, repeats, flash = sys.argv[1:7]
llm, _ = open_llama(model, n_ctx=512)
params = mtmd.mtmd_context_params_default()
params.use_gpu, params.n_threads, params.print_timings, params.warmup = False, int(threads), False, True
params.flash_attn_type = FLASH_ATTN[flash]
ctx = mtmd.mtmd_init_from_file(mmproj.encode(), llm._model.model, params)
px = np.load(image)
times = []
for _ in range(int(repeats)):
    t0 = time.perf_counter()
    chunks = tokenize(ctx, mtmd.mtmd_default_marker().decode(), [px])
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
            n = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
    times.append(time.perf_counter() - t0)
    n_embd = llama_cpp.llama_model_n_embd(llm._model.model)
    out = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(ctx), shape=(n * n_embd,)).copy()
    mtmd.mtmd_input_chunks_free(chunks)
np.save(sys.argv[7], out)
print(json.dumps({"times": times}))
"""

ELELEM_WORKER = r"""
import json, sys, time
import numpy as np
from elelem.vision import Image, Projector
mmproj, image, threads, repeats, flash = sys.argv[1:6]
projector = Projector(mmproj, n_threads=int(threads), flash_attn=flash == "on", cached_images=0)
img = Image.from_pixels(np.load(image))
times = []
for _ in range(int(repeats)):
    t0 = time.perf_counter()
    out = projector.encode(img).embeddings
    times.append(time.perf_counter() - t0)
np.save(sys.argv[6], out.reshape(-1))
print(json.dumps({"times": times}))
"""


def screenshot() -> np.ndarray:
    """A 1024 x 768 picture with a screenshot's flat regions, edges and text-like noise."""
    rng = np.random.default_rng(7)
    px = np.full((768, 1024, 3), 245, np.uint8)
    px[:48] = (40, 44, 52)
    for _ in range(40):
        y, x = rng.integers(60, 740), rng.integers(0, 900)
        px[y:y + 12, x:x + rng.integers(40, 120)] = rng.integers(0, 120, 3)
    return px


FULL_LAYERS = {"gemma3": 27, "qwen25vl": 32, "pixtral": 24}


def files(projector: str, layers: int, cache: Path) -> tuple[Path, Path]:
    from synthetic import TinyConfig, write_model
    from synthetic_mmproj import TinyProjector, write_projector
    from vocab_metadata import vocab_writer

    cache.mkdir(parents=True, exist_ok=True)
    arch = {"qwen25vl": "qwen2vl", "pixtral": "mistral3"}.get(projector, "gemma3")
    mmproj, text = cache / f"{projector}-vision-{layers}l-f16.gguf", cache / f"{arch}-text-256.gguf"
    if not mmproj.exists():
        if projector == "pixtral":
            cfg = TinyProjector(projector_type="pixtral", n_embd=1024, n_head=16, n_ff=4096, n_layer=layers,
                                image_size=1540, patch_size=14, n_merge=2, n_embd_out=256, eps=1e-5, mm_bias=False)
        elif projector == "qwen25vl":
            cfg = TinyProjector(projector_type="qwen2.5vl_merger", n_embd=1280, n_head=16, n_ff=3420,
                                n_layer=layers, image_size=560, patch_size=14, n_wa_pattern=8, n_embd_out=256)
        else:
            cfg = TinyProjector(n_embd=1152, n_head=16, n_ff=4304, n_layer=layers, image_size=896, patch_size=14,
                                n_merge=4, n_embd_out=256)
        write_projector(mmproj, cfg)
    if not text.exists():
        smollm = Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "models" / \
            "smollm2-135m-instruct-q4_1.gguf"
        write_model(text, TinyConfig(arch=arch, n_vocab=49152, n_embd=256, n_head=4, n_head_kv=1, n_layer=1,
                                     head_dim=64, tied=True), extra_metadata=vocab_writer(smollm))
    return mmproj, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--projector", choices=sorted(FULL_LAYERS), default="gemma3")
    ap.add_argument("--layers", type=int, default=None, help="encoder layers (default: all of the real model's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on")
    args = ap.parse_args()
    cache = Path(os.environ.get("ELELEM_CACHE", Path.home() / ".cache" / "elelem")) / "bench"
    layers = args.layers or FULL_LAYERS[args.projector]
    mmproj, text = files(args.projector, layers, cache)
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(tmp) / "screenshot.npy"
        np.save(image, screenshot())
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "support" / "fixtures"),
                                                             str(REPO / "tests" / "support")]))
        common = [str(args.threads), str(args.repeats), args.flash_attn]
        ref = subprocess.run([args.llama_python, "-c", LLAMACPP_WORKER, str(text), str(mmproj), str(image), *common,
                              str(Path(tmp) / "ref.npy")], capture_output=True, text=True, env=env, check=True)
        own = subprocess.run([sys.executable, "-c", ELELEM_WORKER, str(mmproj), str(image), *common,
                              str(Path(tmp) / "own.npy")], capture_output=True, text=True, check=True, cwd=REPO)
        t_ref = min(json.loads(ref.stdout.strip().splitlines()[-1])["times"])
        t_own = min(json.loads(own.stdout.strip().splitlines()[-1])["times"])
        same = np.array_equal(np.load(Path(tmp) / "ref.npy"), np.load(Path(tmp) / "own.npy"))
    print(f"{args.projector} projector, {layers} of {FULL_LAYERS[args.projector]} layers, 1024x768 image, "
          f"{args.threads} threads, flash attention {args.flash_attn}, load average {os.getloadavg()[0]:.1f}")
    print(f"  libmtmd  {t_ref:8.3f} s")
    print(f"  elelem   {t_own:8.3f} s   ({t_ref / t_own:.2f}x libmtmd)   embeddings equal: {same}")


if __name__ == "__main__":
    main()
