"""Sampling (layer 3, above text): the sampling parameters and the vectorized
sampler (:mod:`.sampler`), and token constraints for structured output and
forced tool calls: grammars compiled by llguidance (:mod:`.grammar`, which
reads token bytes through :mod:`elelem.text.tokenizer`) and the per-token
masks that apply them (:mod:`.constrained`).
"""
from .sampler import (
    Sampler, SamplingParams, apply_logit_bias, apply_penalties, filtered_distribution, min_p_filter, softmax,
    top_k_ids, top_p_filter, typical_filter,
)

__all__ = [
    "SamplingParams", "Sampler", "filtered_distribution", "apply_logit_bias", "apply_penalties", "top_k_ids",
    "typical_filter", "top_p_filter", "min_p_filter", "softmax",
]
