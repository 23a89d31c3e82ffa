"""llama.cpp's prompt ids for the infill tests: live under the reference build (cached), or stored.

tests/support/fixtures/make_infill_fixtures.py runs under the llama.cpp
reference python on Qwen2.5-Coder's file and the cases and vocabulary
variants here; without a reference build, the stored
tests/support/fixtures/infill_qwen2.5-coder-0.5b.json is used when it was
made from the same model file, cases and variants (tokenization does not
depend on the machine's kernels), else the test skips (fails under CI=true).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from llamacpp_reference import Reference, file_sha256, run_script, skip_or_fail

SUPPORT = Path(__file__).resolve().parent
STORED = SUPPORT / "fixtures" / "infill_qwen2.5-coder-0.5b.json"

_memo: dict = {}


def llamacpp_infill(qwen_path) -> dict:
    """{"cases": {name: ids}, "variants": {variant: {name: ids}}}, made once per run."""
    if "ref" in _memo:
        return _memo["ref"]
    inputs = [Path(qwen_path), SUPPORT / "infill_cases.py", SUPPORT / "infill_variants.py"]
    live = run_script("make_infill_fixtures.py", ["--out", "{out}/infill.json", "--model", str(qwen_path),
                                                  "--variants", "{out}"], [], inputs, ["infill.json"])
    if live is not None:
        _memo["ref"] = live["infill.json"]
        return _memo["ref"]
    stored = json.loads(STORED.read_text(encoding="utf-8"))
    header = stored["header"]
    digests = {f"{name}_sha256": hashlib.sha256((SUPPORT / f"infill_{name}.py").read_bytes()).hexdigest()
               for name in ("cases", "variants")}
    if header["model_file_sha256"] != file_sha256(Path(qwen_path)) or any(
            header.get(key) != value for key, value in digests.items()):
        skip_or_fail(f"{Reference.not_built()}, and {STORED.name} was made from another model file or cases")
    _memo["ref"] = stored
    return stored
