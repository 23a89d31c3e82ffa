"""The engine (layer 4): sequences, the batch scheduler and stepping.

Filled by the engine rewrite (issue 13); it sits between the API (above) and
text, sampling, model and GGUF (below).
"""
