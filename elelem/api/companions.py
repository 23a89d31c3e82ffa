"""The files that come with a model: its vision projector and its drafter.

A Hugging Face repository ships them beside its models -- ``mmproj-*.gguf``
for the images, ``mtp-*.gguf`` for the multi-token-prediction head that
ggml-org's conversions publish apart from the model -- and llama.cpp's
``-hf`` picks them by name (common/download.cpp, ``find_best_sibling``).
So does elelem (:func:`elelem.model.hub.find_companion`):

- the projector of a model from the Hub comes with it unless ``mmproj=False``
  (llama.cpp's ``--no-mmproj``), as llama.cpp's ``-hf`` fetches it; only for
  a text architecture elelem takes images into (a projector it could not use
  is not downloaded).  A local file's projector is named, never guessed.
- ``draft_model="auto"`` drafts with the model's companion drafter: from the
  Hub, the repository's (its quant nearest the reference's, as llama.cpp's
  ``--spec-type draft-mtp`` picks it); for a local file, one in its folder.
  None there is an error that says so.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

from ..model.companions import ModelName, drafter_for, is_auto, projector_for
from ..model.hub import ProgressFn
from .options import SpeculativeOptions, VisionOptions


def with_companions(model: ModelName, path: Path, vision: VisionOptions, speculation: SpeculativeOptions, *,
                    arch: Optional[str] = None, progress: Optional[ProgressFn] = None,
                    ) -> tuple[VisionOptions, SpeculativeOptions]:
    """``vision`` and ``speculation`` with the companions of the model ``model`` names
    (opened from ``path``; ``arch``: its architecture, read from the file when not given)
    found: ``mmproj`` the projector (None where none comes with it), ``draft_model`` the
    drafter where it was ``"auto"``."""
    mmproj = projector_for(model, path, vision.mmproj, arch=arch, progress=progress)
    if mmproj is not vision.mmproj:
        vision = replace(vision, mmproj=mmproj)
    if is_auto(speculation.draft_model):
        speculation = replace(speculation, draft_model=drafter_for(model, path, progress=progress))
    return vision, speculation
