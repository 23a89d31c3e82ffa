"""Qwen2.5-Coder's vocabulary, changed to show the other layouts of llama.cpp's infill prompt (only
``gguf`` and the standard library: the llama.cpp reference script imports it too).

* ``no_repo_tokens``: ``<|repo_name|>`` and ``<|file_sep|>`` renamed, so neither
  llama.cpp nor elelem finds FIM_REP or FIM_SEP (the ``--- snippet ---`` separator);
* ``bos``: that, and ``add_bos_token`` true (the BOS between the files and FIM_PRE).

Written without tensors: llama.cpp loads it with ``vocab_only``.
"""
from __future__ import annotations

from pathlib import Path

import gguf

RENAMED = {"<|repo_name|>": "<|repo_x|>", "<|file_sep|>": "<|file_x|>"}
VARIANTS = {"no_repo_tokens": {}, "bos": {"tokenizer.ggml.add_bos_token": True}}


def write_variant(src: Path, dst: Path, name: str) -> Path:
    overrides = VARIANTS[name]
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or not field.types:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value = [RENAMED.get(token, token) for token in value]
        writer.add_key_value(key, overrides.get(key, value), vtype, sub)
    for key, value in overrides.items():
        if key not in reader.fields:
            writer.add_bool(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
