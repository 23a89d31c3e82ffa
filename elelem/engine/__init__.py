"""The engine (layer 4): sequences, the batch scheduler and stepping.

It sits between the API (above) and text, sampling, model and GGUF (below).
"""
