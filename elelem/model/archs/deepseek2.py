"""DeepSeek-V2 and its descendants (llama.cpp's deepseek2): multi-head latent
attention (archspec/mla.py), leading dense layers, then routed experts with
shared ones -- GLM-4.7-Flash, DeepSeek-V2(-Lite), Moonlight, Kimi-K2."""
from typing import Any, Mapping

from ...errors import ModelShapeError
from ..archspec.experts import GATING
from ..archspec.hparams import Key, array, nextn
from ..archspec.mla import MLA_KV, MLA_Q_LORA, mla_hparams, mla_kq_scale, mla_yarn_attn_factor
from ..archspec.roles import DENSE_FFN, EXPERTS, SHARED_EXPERTS
from ..archspec.spec import Architecture, Experts

_ATTN = ("attn_norm", "wo", "ffn_norm") + MLA_KV


def _vocab_size(gguf: Any) -> int:
    """The vocabulary size llama.cpp's deepseek2 reading sees: <arch>.vocab_size, else the token list's."""
    size = gguf.get("deepseek2.vocab_size")
    if size is None:
        tokens = array(gguf.get("tokenizer.ggml.tokens"))
        return len(tokens) if tokens is not None else 0
    if isinstance(size, bool) or not isinstance(size, int):
        raise ModelShapeError(f"deepseek2.vocab_size = {size!r} must be an integer")
    return size


def deepseek2_hparams(h: dict, key: Key, gguf: Any) -> None:
    nextn(h, key, gguf)
    n_vocab = _vocab_size(gguf)
    # llama.cpp's "lite" variants (DeepSeek-V2-Lite, Moonlight: 27 layers, ...) have no
    # q_lora_rank; every other one must give it.
    lite = h["n_layer"] in (26, 27) or (h["n_layer"] == 48 and n_vocab == 128256)
    mla_hparams(h, key, gguf, q_lora_required=not lite)
    # GLM-4.7-Flash's files carry no expert_gating_func: llama.cpp takes sigmoid for its
    # shape (47 or 48 layers, 154880 tokens) and softmax for the older DeepSeek files.
    if int(key("expert_gating_func", 0)) == 0:
        glm47_flash = h["n_layer"] in (47, 48) and n_vocab == 154880
        h["expert_gating"] = GATING["sigmoid" if glm47_flash else "softmax"]
    groups, groups_used = int(key("expert_group_count", 0)), int(key("expert_group_used_count", 0))
    if groups > 1:
        raise ModelShapeError(
            f"deepseek2.expert_group_count = {groups} (with expert_group_used_count = {groups_used}): grouped "
            f"expert routing (DeepSeek-V3's) is not supported by elelem; files with one group are")
    if not 0 <= h["n_layer_dense_lead"] <= h["n_layer"]:
        raise ModelShapeError(f"deepseek2.leading_dense_block_count = {h['n_layer_dense_lead']} is out of range")
    if h["n_expert_shared"] > 0 and h["n_ff_shexp"] <= 0:
        raise ModelShapeError("deepseek2.expert_shared_count needs expert_feed_forward_length")
    if float(key("attention.temperature_scale", 0.0)) != 0.0:
        raise ModelShapeError("deepseek2.attention.temperature_scale (Mistral Large's temperature tuning) "
                              "is not supported by elelem")
    h["rope_attn_factor"] = mla_yarn_attn_factor(h, key)
    h["attn_scale"] = mla_kq_scale(h, key)


def deepseek2_layer_roles(h: Mapping[str, Any], i: int,
                          tensors: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Q compressed (q_lora_rank > 0) or projected directly; the dense FFN in
    the leading layers, then experts, shared experts and the selection bias
    (llama_model_deepseek2::load_arch_tensors)."""
    q = MLA_Q_LORA if h["q_lora_rank"] > 0 else ("wq",)
    if h["q_lora_rank"] == 0 and f"blk.{i}.attn_q_a.weight" in tensors:
        raise ModelShapeError(f"blk.{i}.attn_q_a.weight is there but deepseek2.attention.q_lora_rank is not")
    if i < h["n_layer_dense_lead"]:
        return _ATTN + q + DENSE_FFN, ()
    shared = SHARED_EXPERTS if h["n_expert_shared"] > 0 else ()
    return _ATTN + q + EXPERTS + shared, ("ffn_exp_probs_b",)


ARCH = Architecture("deepseek2", "deepseek2", "normal", _ATTN,
                    experts=Experts(gating="softmax", normalize=None, optional=("ffn_exp_probs_b",)),
                    derive=deepseek2_hparams, layer_roles=deepseek2_layer_roles, mtp_builder="deepseek2_mtp",
                    description="GLM-4.7-Flash, DeepSeek-V2(-Lite), Moonlight, Kimi-K2 (multi-head latent attention)")
