"""Tokenizers read from GGUF metadata, producing the same ids as llama.cpp.

    >>> tok = Tokenizer.from_metadata(gguf_metadata)
    >>> ids = tok.encode("Hello, world!")
    >>> tok.decode(ids)
    b'Hello, world!'

These vocabulary kinds are supported: byte-level BPE (``tokenizer.ggml.model =
"gpt2"``: Qwen2, Llama 3, SmolLM, GPT-2), SentencePiece-style BPE
(``"llama"``: Llama 2, Gemma), WordPiece (``"bert"``: BERT, nomic-bert;
see :mod:`.wpm`) and SentencePiece Unigram (``"t5"``: T5, XLM-RoBERTa's
bge-reranker and nomic-embed-text-v2-moe; see :mod:`.ugm`).  The behaviour follows llama.cpp's ``llama_tokenize`` /
``llama_token_to_piece`` (llama-vocab.cpp).

WordPiece
    ``encode`` adds [CLS] (the BOS id) and [SEP] (``seperator_token_id``)
    whenever it adds special tokens, whatever the GGUF's add_bos/add_eos say,
    as llama.cpp does; ``add_bos=False`` leaves out both.  The text is
    lowercased and its accents stripped unless
    ``tokenizer.ggml.normalizer.lowercase`` / ``.strip_accents`` say not.
    ``decode`` joins the pieces with ``▁`` as a space and, as
    llama-cpp-python's ``detokenize``, drops the space the text starts with
    when the ids start with [CLS].  A BERT vocabulary without [UNK], [CLS]
    or [SEP], or with byte tokens, raises ``GGUFError``.

Decoding
    ``decode`` concatenates each token's piece (``llama_token_to_piece``);
    for vocabularies with ``add_space_prefix`` the space ``encode`` added in
    front is dropped again.  ``stream_decoder()`` yields the same text in
    pieces, each ending at a complete UTF-8 character.

Special tokens
    Control tokens (``<|im_start|>``, ``<start_of_turn>``, ...) are recognised in
    the text only with ``encode(..., special=True)``; otherwise their text is
    tokenized like any other.  User-defined tokens (e.g. Qwen's ``<tool_call>``,
    Gemma's whitespace runs and HTML tags) are always recognised, as in
    llama.cpp.  ``decode`` renders control tokens only with ``special=True``.

Hostile input
    * Inputs over :data:`MAX_INPUT_BYTES` (64 MiB of UTF-8) raise ``ValueError``
      (:class:`elelem.errors.InvalidArgumentError`).
    * ``bytes`` that are not valid UTF-8: byte-level BPE, WordPiece and Unigram replace
      each invalid byte with U+FFFD (which WordPiece then drops), as llama.cpp
      does for stray and truncated bytes
      (llama.cpp decodes overlong and surrogate encodings leniently; elelem
      treats them as invalid).  SentencePiece vocabularies keep the raw bytes,
      split into symbols as llama.cpp splits them (a lead byte claims the
      bytes it announces), and emit ``<0xNN>`` byte tokens for what no token
      covers, so ``decode`` restores the input.
    * ``str`` with lone surrogates: each surrogate is tokenized as U+FFFD.
    * NUL and other control characters are ordinary text (WordPiece drops
      them, and format and private-use characters, as llama.cpp does).
    * As in llama.cpp, a byte the vocabulary has no token for is dropped
      (SmolLM2 lacks 21 of the 256, e.g. 0x04 and 0xF1), and SentencePiece
      reads a literal U+2581 ``▁`` in the text as a space.
    * Time and memory grow linearly with the input: the pre-tokenizer
      patterns never backtrack beyond one run and nothing recurses on the
      input.  The one super-linear step is merging a single huge word (a
      megabyte of one letter), done with a heap in O(n log n): a few seconds
      and about 200 MB per megabyte of such a word.

Not supported: RWKV vocabularies, and llama.cpp's per-model
``lstrip`` / ``rstrip`` token attributes (Phi-3, Jina, ModernBERT, and
nomic-bert-moe's ``<mask>``).
"""
from .stream import StreamDecoder
from .text_input import MAX_INPUT_BYTES
from .tokenizer import Tokenizer

__all__ = ["Tokenizer", "StreamDecoder", "MAX_INPUT_BYTES"]
