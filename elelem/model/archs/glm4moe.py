"""GLM-4.5 and 4.6: experts chosen by sigmoid with a selection bias, a
shared expert, leading dense layers, and multi-token-prediction layers that
the main graph skips and elelem.model.mtp opens as a drafting head
(llama.cpp's glm4moe)."""
from ..archspec.hparams import nextn
from ..archspec.roles import ATTN, EXPERTS, POST_ATTENTION_FFN_NORM
from ..archspec.spec import Architecture, Experts

ARCH = Architecture("glm4moe", "decoder", "neox", ATTN, optional=("bq", "bk", "bv", "q_norm", "k_norm"),
                    experts=Experts(gating="sigmoid", normalize=None, required=EXPERTS + ("ffn_exp_probs_b",)),
                    tensor_names=POST_ATTENTION_FFN_NORM, derive=nextn, mtp_builder="decoder_mtp",
                    description="GLM-4.5, GLM-4.5-Air, GLM-4.6")
