"""Qwen3.5 and 3.6 (dense): Gated DeltaNet layers, with a full-attention
layer every few (graph/arch_qwen35.pxi)."""
from ..archspec.delta_net import DELTA_NET, qwen35_hparams, state_floats
from ..archspec.roles import ATTN_FFN, DENSE_FFN, POST_ATTENTION_FFN_NORM
from ..archspec.spec import Architecture

ARCH = Architecture("qwen35", "qwen35", "neox", ATTN_FFN + ("q_norm", "k_norm"), recurrent=DELTA_NET + DENSE_FFN,
                    tensor_names=POST_ATTENTION_FFN_NORM,
                    recurrent_state=state_floats, recurrent_kind="Gated DeltaNet", derive=qwen35_hparams,
                    mtp_builder="qwen35_mtp",
                    description="Qwen3.5 / Qwen3.6 (Gated DeltaNet hybrid)")
