"""BERT encoders (embedding models): absolute positions and token types,
post-norm LayerNorms, a GELU FFN with biases; Q/K/V separate or fused."""
from ..archspec import encoder as _encoder
from ..archspec.spec import Architecture

ARCH = Architecture("bert", "bert", "neox", _encoder.BLOCK, optional=_encoder.OPTIONAL,
                    activation="gelu", derive=_encoder.encoder_hparams, encoder=True,
                    global_required=("tok_embd", "pos_embd", "tok_norm", "tok_norm_b"),
                    global_optional=_encoder.GLOBAL_OPTIONAL,
                    description="BERT encoders (embedding models: MiniLM, BGE, E5, ...)")
