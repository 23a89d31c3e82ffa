"""The API (layer 5): :class:`~elelem.api.llm.LLM`, sessions, text generation and
completions in llama-cpp-python's shapes, and tool calling (:mod:`.tools`).

Nothing is imported here (``elelem.LLM`` is loaded lazily by ``elelem/__init__``),
so importing one module of this package does not load the native core.
"""
