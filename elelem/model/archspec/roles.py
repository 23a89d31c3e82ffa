"""The tensor roles several architectures share: attention, the dense and
the expert FFNs, and the model-wide tensors.  A role only one architecture
has is declared in that architecture's module.

Shapes are ggml's (ne0, ne1, ...): a matrix that maps n_in to n_out is
(n_in, n_out).  Each shape is a function of the hyperparameters, so that a
layer with its own widths (Gemma 4) is checked against its own.
"""
from __future__ import annotations

from typing import Any, Mapping

from .spec import Role


def _e(h: Mapping[str, Any]) -> int:
    return h["n_embd"]


def _attn_in(h: Mapping[str, Any]) -> int:
    """The width Q, K and V are projected from: n_embd, or what the model
    says (EAGLE-3: the token's and the target's states side by side)."""
    return h.get("n_embd_attn_in") or h["n_embd"]


def _q(h: Mapping[str, Any]) -> int:
    return h["n_head"] * h["head_dim_k"]


def _k(h: Mapping[str, Any]) -> int:
    return h["n_head_kv"] * h["head_dim_k"]


def _v(h: Mapping[str, Any]) -> int:
    return h["n_head_kv"] * h["head_dim_v"]


def _qkv(h: Mapping[str, Any]) -> int:
    """The fused Q/K/V projection's width: Q, K and V (BERT), or the Gated
    DeltaNet convolution's channels (Q and K of each key head, and V)."""
    if "ssm_d_inner" in h:
        return 2 * h["ssm_d_state"] * h["ssm_n_group"] + h["ssm_d_inner"]
    return _q(h) + _k(h) + _v(h)


def _embd(doc: str = "(n_embd)"):
    return {"shape": lambda h: (_e(h),), "doc": doc}


ROLES = (
    Role("attn_norm", "blk.{i}.attn_norm.weight", **_embd()),
    # Q's projection also writes the output gate, head by head, where q_gate (Qwen3.5)
    Role("wq", "blk.{i}.attn_q.weight", lambda h: (_attn_in(h), 2 * _q(h) if h.get("q_gate") else _q(h)),
         "(n_embd, n_head * head_dim_k)", matmul=True),
    Role("wk", "blk.{i}.attn_k.weight", lambda h: (_attn_in(h), _k(h)), "(n_embd, n_head_kv * head_dim_k)", matmul=True),
    Role("wv", "blk.{i}.attn_v.weight", lambda h: (_attn_in(h), _v(h)), "(n_embd, n_head_kv * head_dim_v)", matmul=True),
    Role("wo", "blk.{i}.attn_output.weight", lambda h: (h["n_head"] * h["head_dim_v"], _e(h)),
         "(n_head * head_dim_v, n_embd)", matmul=True),
    Role("bq", "blk.{i}.attn_q.bias", lambda h: (_q(h),), "optional biases, NULL when absent"),
    Role("bk", "blk.{i}.attn_k.bias", lambda h: (_k(h),)),
    Role("bv", "blk.{i}.attn_v.bias", lambda h: (_v(h),)),
    Role("bo", "blk.{i}.attn_output.bias", lambda h: (_e(h),)),
    Role("q_norm", "blk.{i}.attn_q_norm.weight", lambda h: (h["head_dim_k"],), "optional per-head norms (head_dim_k)"),
    Role("k_norm", "blk.{i}.attn_k_norm.weight", lambda h: (h["head_dim_k"],)),
    Role("attn_post_norm", "blk.{i}.post_attention_norm.weight", **_embd("optional norm after attention (n_embd)")),
    Role("ffn_norm", "blk.{i}.ffn_norm.weight", **_embd()),
    Role("ffn_gate", "blk.{i}.ffn_gate.weight", lambda h: (_e(h), h["n_ff"]), "(n_embd, n_ff)", matmul=True),
    Role("ffn_up", "blk.{i}.ffn_up.weight", lambda h: (_e(h), h["n_ff"]), "(n_embd, n_ff)", matmul=True),
    Role("ffn_down", "blk.{i}.ffn_down.weight", lambda h: (h["n_ff"], _e(h)), "(n_ff, n_embd)", matmul=True),
    Role("ffn_post_norm", "blk.{i}.post_ffw_norm.weight", **_embd("optional norm after the FFN (n_embd)")),
    # Q, K and V in one projection: BERT-family encoders (wq/wk/wv are NULL with it), and
    # the Gated DeltaNet's Q, K and V, which a short causal convolution follows.
    Role("wqkv", "blk.{i}.attn_qkv.weight", lambda h: (_e(h), _qkv(h)), "(n_embd, Q + K + V widths)", matmul=True),
    Role("bqkv", "blk.{i}.attn_qkv.bias", lambda h: (_qkv(h),)),
    # Mixture of experts: the router, the experts stacked along a third
    # dimension (n_in, n_out, n_expert), their biases (gpt-oss), the expert
    # selection bias (GLM) and the shared experts (GLM, Qwen).  NULL in a dense layer.
    Role("ffn_gate_inp", "blk.{i}.ffn_gate_inp.weight", lambda h: (_e(h), h["n_expert"]),
         "the router (n_embd, n_expert)", matmul=True),
    Role("ffn_gate_inp_b", "blk.{i}.ffn_gate_inp.bias", lambda h: (h["n_expert"],), "optional (n_expert)"),
    Role("ffn_gate_exps", "blk.{i}.ffn_gate_exps.weight", lambda h: (_e(h), h["n_ff_exp"], h["n_expert"]),
         "(n_embd, n_ff_exp, n_expert)", matmul=True),
    Role("ffn_up_exps", "blk.{i}.ffn_up_exps.weight", lambda h: (_e(h), h["n_ff_exp"], h["n_expert"]),
         "(n_embd, n_ff_exp, n_expert)", matmul=True),
    Role("ffn_down_exps", "blk.{i}.ffn_down_exps.weight", lambda h: (h["n_ff_exp"], _e(h), h["n_expert"]),
         "(n_ff_exp, n_embd, n_expert)", matmul=True),
    # the experts' biases are added (ggml_add_id), so they are F32 like vectors
    Role("ffn_gate_exps_b", "blk.{i}.ffn_gate_exps.bias", lambda h: (h["n_ff_exp"], h["n_expert"]),
         "optional (n_ff_exp, n_expert)", f32=True),
    Role("ffn_up_exps_b", "blk.{i}.ffn_up_exps.bias", lambda h: (h["n_ff_exp"], h["n_expert"]),
         "optional (n_ff_exp, n_expert)", f32=True),
    Role("ffn_down_exps_b", "blk.{i}.ffn_down_exps.bias", lambda h: (_e(h), h["n_expert"]),
         "optional (n_embd, n_expert)", f32=True),
    Role("ffn_exp_probs_b", "blk.{i}.exp_probs_b.bias", lambda h: (h["n_expert"],),
         "optional (n_expert): added to the probabilities for choosing only (GLM)"),
    Role("ffn_gate_shexp", "blk.{i}.ffn_gate_shexp.weight", lambda h: (_e(h), h["n_ff_shexp"]),
         "optional shared experts (n_embd, n_ff_shexp) ...", matmul=True),
    Role("ffn_up_shexp", "blk.{i}.ffn_up_shexp.weight", lambda h: (_e(h), h["n_ff_shexp"]), matmul=True),
    Role("ffn_down_shexp", "blk.{i}.ffn_down_shexp.weight", lambda h: (h["n_ff_shexp"], _e(h)),
         "... (n_ff_shexp, n_embd)", matmul=True),
    Role("ffn_gate_inp_shexp", "blk.{i}.ffn_gate_inp_shexp.weight", lambda h: (_e(h),),
         "optional (n_embd): a sigmoid gate on the shared experts' output (Qwen)", matmul=True),
    # the experts' gate and up in one stack, gate first (Gemma 4), and each expert's output scale
    Role("ffn_gate_up_exps", "blk.{i}.ffn_gate_up_exps.weight",
         lambda h: (_e(h), 2 * h["n_ff_exp"], h["n_expert"]),
         "optional: the experts' gate and up stacked (n_embd, 2 * n_ff_exp, n_expert)", matmul=True),
    Role("ffn_down_exps_s", "blk.{i}.ffn_down_exps.scale", lambda h: (h["n_expert"],),
         "optional: each expert's output scale (n_expert)"),
)

# Model-wide tensors.  The core keeps these as fields of its Model, by name.
GLOBAL_ROLES = (
    Role("tok_embd", "token_embd.weight", lambda h: (_e(h), h["n_vocab"]), "(n_embd, n_vocab)"),
    Role("output_norm", "output_norm.weight", lambda h: (_e(h),)),
    # absent: tied to tok_embd
    Role("output", "output.weight", lambda h: (_e(h), h["n_vocab"]), matmul=True),
    # head_dim / 2 factors of the layers that rotate through it
    Role("rope_freqs", "rope_freqs.weight", lambda h: (h.get("rope_freqs_dims", h["n_rot"]) // 2,)),
    # BERT-family inputs: absolute positions, token types, the LayerNorm of their sum
    Role("pos_embd", "position_embd.weight", lambda h: (_e(h), h["n_ctx_train"])),
    Role("type_embd", "token_types.weight", lambda h: (_e(h), h.get("n_token_types", 0)), f32=True),
    Role("tok_norm", "token_embd_norm.weight", lambda h: (_e(h),)),
    Role("tok_norm_b", "token_embd_norm.bias", lambda h: (_e(h),)),
    # Gemma 4's per-layer token embeddings: the table, the projection of the embeddings, its norm
    Role("per_layer_tok_embd", "per_layer_token_embd.weight",
         lambda h: (h["n_embd_per_layer"] * h["n_layer"], h["n_vocab"])),
    Role("per_layer_model_proj", "per_layer_model_proj.weight",
         lambda h: (_e(h), h["n_embd_per_layer"] * h["n_layer"]), matmul=True),
    Role("per_layer_proj_norm", "per_layer_proj_norm.weight", lambda h: (h["n_embd_per_layer"],)),
)

# The GGUF name of each role above.
NAMES = {r.name: r.gguf for r in ROLES + GLOBAL_ROLES}

# The roles of the common layer kinds.
ATTN = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm")
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")
ATTN_FFN = ATTN + DENSE_FFN
EXPERTS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
EXPERT_BIASES = ("ffn_gate_inp_b", "ffn_gate_exps_b", "ffn_up_exps_b", "ffn_down_exps_b")
SHARED_EXPERTS = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
# llama.cpp's gpt-oss, glm4moe, qwen35 and qwen3next files name the FFN's norm post_attention_norm
POST_ATTENTION_FFN_NORM = {"ffn_norm": "blk.{i}.post_attention_norm.weight"}
