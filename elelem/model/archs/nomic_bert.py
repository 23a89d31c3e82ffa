"""Nomic BERT encoders: BERT's block with RoPE instead of absolute
positions, and a SwiGLU FFN (ffn_gate)."""
from ..archspec import encoder as _encoder
from ..archspec.spec import Architecture

ARCH = Architecture("nomic-bert", "bert", "neox", _encoder.BLOCK + ("ffn_gate",), optional=_encoder.OPTIONAL,
                    derive=_encoder.encoder_hparams, encoder=True,
                    global_required=("tok_embd", "tok_norm", "tok_norm_b"),
                    global_optional=_encoder.GLOBAL_OPTIONAL,
                    description="Nomic BERT encoders (nomic-embed-text)")
