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

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Optional, Union

from ..errors import ElelemError, InvalidArgumentError, ModelNotFoundError
from ..gguf.reader import read_gguf
from ..model.hf_reference import PROJECTOR
from ..model.hub import ProgressFn, find_companion, is_hub_reference
from .images import ARCHS_WITH_IMAGES
from .options import SpeculativeOptions, VisionOptions

log = logging.getLogger("elelem")

#: ``draft_model``'s value that asks for the model's companion drafter.
AUTO = "auto"
#: The companion drafters elelem drafts with, by the prefix llama.cpp's converter names them
#: with (the MTP head: elelem.model.mtp.is_companion).  llama.cpp also infers EAGLE-3,
#: DFlash and DSpark heads from ``eagle3-``, ``dflash-`` and ``dspark-`` files
#: (elelem.model.hf_reference.DRAFTERS); they join here with their architectures.
RUNNABLE_DRAFTERS = ("mtp-",)

ModelName = Union[str, "os.PathLike[str]", None]


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


def is_auto(draft_model) -> bool:
    return isinstance(draft_model, str) and draft_model == AUTO


def projector_for(model: ModelName, path: Path, mmproj, *, arch: Optional[str] = None,
                  progress: Optional[ProgressFn] = None, force: bool = False):
    """The projector to open: ``mmproj`` as given (a path; False: none), or, where it is
    None and ``model`` is a Hub reference of an architecture that takes images, the
    repository's ``mmproj`` file (None where it ships none)."""
    if mmproj is not None:
        return mmproj
    if not is_hub_reference(model):
        return None
    if arch is None:
        try:
            arch = str(read_gguf(path).get("general.architecture", ""))
        except ElelemError as error:   # opening the model says what is wrong with it
            log.debug("%s: no projector fetched: %s", model, error)
            return None
    if arch not in ARCHS_WITH_IMAGES:
        log.debug("%s: no projector fetched: elelem takes images into %s models only, not %r", model,
                  ", ".join(ARCHS_WITH_IMAGES), arch)
        return None
    found = find_companion(model, path, (PROJECTOR,), progress=progress, force=force)
    if found is None:
        log.info("%s: the repository ships no projector (mmproj-*.gguf): the model reads text only", model)
    else:
        log.info("%s: projector %s", model, found.name)
    return found


def drafter_for(model: ModelName, path: Path, *, progress: Optional[ProgressFn] = None, force: bool = False) -> Path:
    """The companion drafter of the model ``model`` names (``draft_model="auto"``)."""
    if model is None or (isinstance(model, str) and not is_hub_reference(model) and not os.path.exists(model)):
        raise InvalidArgumentError(f"draft_model='auto' looks for the drafter beside a model file or in its "
                                   f"Hugging Face repository; {model or 'the default model'} has neither")
    found = find_companion(model, path, RUNNABLE_DRAFTERS, progress=progress, force=force)
    if found is None:
        where = "its Hugging Face repository ships" if is_hub_reference(model) else f"{Path(path).parent} holds"
        raise ModelNotFoundError(
            f"draft_model='auto': {where} no drafter for {model} ({', '.join(p + '*.gguf' for p in RUNNABLE_DRAFTERS)}"
            f", as llama.cpp's converter names the MTP head it publishes apart); name a draft model instead")
    log.info("%s: drafter %s", model, found.name)
    return found
