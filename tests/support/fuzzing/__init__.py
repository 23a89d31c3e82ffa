"""Fuzzing harness for elelem: hostile GGUF files, tokenizer input and chat templates.

Every case runs in a subprocess (:mod:`fuzzing.runner`), so a case that
kills the process (a ``GGML_ASSERT``, a segfault, a sanitizer report) is
caught, attributed and saved instead of taking the fuzzer down with it.

* :mod:`~fuzzing.gguf_target`, :mod:`~fuzzing.tokenizer_target`,
  :mod:`~fuzzing.template_target` -- what each target runs, and its cases;
* :mod:`~fuzzing.gguf_mutator`, :mod:`~fuzzing.gguf_layout`,
  :mod:`~fuzzing.seeds` -- structure-aware GGUF mutation;
* :mod:`~fuzzing.driver` -- batches, time limits, crash attribution;
* :mod:`~fuzzing.crashers` -- failing inputs kept as regression fixtures.

Entry points: ``scripts/fuzz.py`` (campaigns), ``tests/test_fuzz.py`` (the
short CI version and the replay of saved crashers), ``scripts/sanitize.sh``.
"""
