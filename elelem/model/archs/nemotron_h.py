"""NVIDIA Nemotron-H (llama.cpp's nemotron_h, graph/arch_nemotron_h.pxi):
Mamba-2 layers, attention layers without positional encoding, and layers
that are a squared-ReLU MLP alone, each after one RMS norm, interleaved as
the per-layer ``attention.head_count_kv`` and ``feed_forward_length`` say
(elelem.model.archspec.mamba2)."""
from ..archspec.mamba2 import (ATTENTION_BIASES, MAMBA2, NEMOTRON_ATTENTION, layer_kinds_from_kv_heads_and_ffn,
                               mamba2_shape, nemotron_h_hparams, nemotron_h_layer_roles, state_floats)
from ..archspec.spec import Architecture

ARCH = Architecture("nemotron_h", "nemotron_h", "neox", NEMOTRON_ATTENTION, optional=ATTENTION_BIASES,
                    layer_kinds=layer_kinds_from_kv_heads_and_ffn, layer_roles=nemotron_h_layer_roles,
                    derive=nemotron_h_hparams, recurrent=MAMBA2, recurrent_state=state_floats,
                    recurrent_kind="Mamba-2", shape=mamba2_shape,
                    description="NVIDIA Nemotron-H (Mamba-2 hybrid)")
