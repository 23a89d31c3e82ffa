"""GGUF files: a validating reader that runs before ggml sees a file (layer 2).

Imports only :mod:`elelem.errors` and, for its fast string-array scan, the
native core (:mod:`elelem._core`, optional: a pure-Python scan is the fallback).
"""
from .reader import GGML_TYPES, GGUFFile, GGUFValueType, TensorInfo, read_gguf, validate_tokenizer_metadata

__all__ = ["GGML_TYPES", "GGUFFile", "GGUFValueType", "TensorInfo", "read_gguf", "validate_tokenizer_metadata"]
