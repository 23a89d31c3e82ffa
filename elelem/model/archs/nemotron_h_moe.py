"""NVIDIA Nemotron-3-Nano (llama.cpp's nemotron_h_moe, graph/arch_nemotron_h.pxi):
Nemotron-H's layers with experts where Nemotron-H has its MLP -- routed by a
sigmoid with a selection bias, the chosen weights renormalised (as the file
says) and scaled, each expert and the one shared expert a squared-ReLU FFN
without gate."""
from ..archspec.mamba2 import (ATTENTION_BIASES, MAMBA2, NEMOTRON_ATTENTION, mamba2_shape, nemotron_h_layer_roles,
                               nemotron_h_moe_hparams, nemotron_h_moe_layer_kinds, state_floats)
from ..archspec.roles import EXPERTS
from ..archspec.spec import Architecture, Experts

ARCH = Architecture("nemotron_h_moe", "nemotron_h", "neox", NEMOTRON_ATTENTION, optional=ATTENTION_BIASES,
                    experts=Experts(gating="sigmoid", normalize=None, activation="relu_sqr",
                                    required=EXPERTS + ("ffn_exp_probs_b",)),
                    layer_kinds=nemotron_h_moe_layer_kinds, layer_roles=nemotron_h_layer_roles,
                    derive=nemotron_h_moe_hparams, recurrent=MAMBA2, recurrent_state=state_floats,
                    recurrent_kind="Mamba-2", shape=mamba2_shape,
                    description="NVIDIA Nemotron-3-Nano (Mamba-2 hybrid with experts)")
