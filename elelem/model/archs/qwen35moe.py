"""Qwen3.5 and 3.6 with experts: Qwen3.5's layers, each with routed experts
and a gated shared expert where the file has one."""
from ..archspec.delta_net import DELTA_NET, qwen35_hparams, state_floats
from ..archspec.roles import ATTN, POST_ATTENTION_FFN_NORM
from ..archspec.spec import Architecture, Experts

ARCH = Architecture("qwen35moe", "qwen35", "neox", ATTN + ("q_norm", "k_norm"), recurrent=DELTA_NET,
                    experts=Experts(optional=("ffn_gate_inp_shexp",)),
                    tensor_names=POST_ATTENTION_FFN_NORM,
                    recurrent_state=state_floats, recurrent_kind="Gated DeltaNet", derive=qwen35_hparams,
                    mtp_builder="qwen35_mtp",
                    description="Qwen3.5 / Qwen3.6 MoE (Gated DeltaNet hybrid with experts)")
