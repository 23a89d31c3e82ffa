"""Text (layer 3): the tokenizers (:mod:`.tokenizer`), chat templates and their
sandbox (:mod:`.chat_template`, :mod:`.template_sandbox`) and stop strings
(:mod:`.stop_strings`).

Nothing is imported here: jinja2 loads only for the code that renders templates.
"""
