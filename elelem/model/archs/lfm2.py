"""Liquid LFM2 and LFM2.5: short gated convolution layers beside attention
layers with per-head Q/K norms (llama.cpp's lfm2, graph/arch_lfm2.pxi).
Which layers are convolutions comes from attention.head_count_kv (0 for a
convolution layer)."""
from ..archspec.roles import ATTN_FFN, DENSE_FFN
from ..archspec.shortconv import OUTPUT_NORM, SHORTCONV, lfm2_hparams, state_floats
from ..archspec.spec import Architecture

ARCH = Architecture("lfm2", "lfm2", "neox", ATTN_FFN + ("q_norm", "k_norm"), recurrent=SHORTCONV + DENSE_FFN,
                    recurrent_from_kv_heads=True, recurrent_state=state_floats, recurrent_kind="short convolution",
                    tensor_names=OUTPUT_NORM, derive=lfm2_hparams,
                    description="Liquid LFM2 / LFM2.5 (short-convolution hybrid)")
