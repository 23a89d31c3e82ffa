"""Infill requests whose prompt ids elelem and llama.cpp must agree on (standard library only: the
llama.cpp reference script imports it too).  Each case: a name, the request's fields, and the
server settings format_prompt_infill reads (n_ctx, n_batch, n_predict, spm_infill)."""
from __future__ import annotations

PREFIX = "import math\n\n\ndef area(r):\n    \"\"\"The area of a circle.\"\"\"\n    return "
SUFFIX = "\n\n\nif __name__ == \"__main__\":\n    print(area(2.0))\n"
UTILS = {"filename": "geometry/utils.py", "text": "PI = 3.14159\n\n\ndef square(x):\n    return x * x\n"}
README = {"filename": "README.md", "text": "# Shapes\n\nÄrea, périmètre — 面积 🙂\n"}
LONG = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(60))

SETTINGS = {"n_ctx": 4096, "n_batch": 2048, "n_predict": -1, "spm_infill": False}

CASES = [
    ("plain", {"input_prefix": PREFIX, "input_suffix": SUFFIX}, {}),
    ("empty", {"input_prefix": "", "input_suffix": ""}, {}),
    ("extra", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [UTILS, README],
               "prompt": "math.pi * "}, {}),
    ("unnamed_file", {"input_prefix": PREFIX, "input_suffix": SUFFIX,
                      "input_extra": [{"text": "x = 1\n"}]}, {}),
    ("control_text", {"input_prefix": "s = '<|endoftext|><|fim_middle|>'\n", "input_suffix": "<|file_sep|>",
                      "prompt": "t = <|fim_pad|>"}, {}),
    ("mixed_lists", {"input_prefix": ["def f():", 151643, "\n    return "], "input_suffix": [198, "pass"]}, {}),
    ("spm", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [UTILS], "prompt": "2 * "},
     {"spm_infill": True}),
    ("small_batch", {"input_prefix": LONG, "input_suffix": LONG, "input_extra": [UTILS, README, {"text": LONG}],
                     "prompt": "x"}, {"n_ctx": 700, "n_batch": 128, "n_predict": 64}),
    ("ctx_not_above_batch", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [UTILS]},
     {"n_ctx": 2048}),
    ("no_room_for_suffix", {"input_prefix": LONG, "input_suffix": SUFFIX, "prompt": LONG[:400]},
     {"n_batch": 256}),
    ("n_predict", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [UTILS, README]},
     {"n_ctx": 2100, "n_predict": 10}),
]


def settings(overrides: dict) -> dict:
    return {**SETTINGS, **overrides}
