"""Sampling (layer 3, above text): the sampling parameters and the vectorized
sampler (:mod:`.sampler`), and token constraints for JSON-schema constrained
decoding (:mod:`.json_automaton`, :mod:`.constrained`; these read token texts
through :mod:`elelem.text.tokenizer`).
"""
from .sampler import (
    Sampler, SamplingParams, apply_logit_bias, apply_penalties, filtered_distribution, min_p_filter, softmax,
    top_k_ids, top_p_filter, typical_filter,
)

__all__ = [
    "SamplingParams", "Sampler", "filtered_distribution", "apply_logit_bias", "apply_penalties", "top_k_ids",
    "typical_filter", "top_p_filter", "min_p_filter", "softmax",
]
