"""BERT encoders (embedding models): absolute positions and token types,
post-norm LayerNorms, a GELU FFN with biases; Q/K/V separate or fused.
Cross-encoder rerankers (bge-reranker) add a classification head (``cls``,
``cls.output``)."""
from ..archspec import encoder as _encoder
from ..archspec import rank as _rank
from ..archspec.spec import Architecture

ARCH = Architecture("bert", "bert", "neox", _encoder.BLOCK, optional=_encoder.OPTIONAL,
                    activation="gelu", derive=_encoder.encoder_hparams, encoder=True,
                    global_required=("tok_embd", "pos_embd", "tok_norm", "tok_norm_b"),
                    global_optional=_encoder.GLOBAL_OPTIONAL + _rank.HEAD,
                    description="BERT encoders (embedding models: MiniLM, BGE, E5, ...)")
