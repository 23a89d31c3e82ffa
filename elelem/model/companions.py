"""Finding the files that come with a model: its vision projector and its drafter.

A Hugging Face repository ships them beside its models -- ``mmproj-*.gguf``
for the images, ``mtp-*.gguf``, ``dflash-*.gguf`` and ``eagle3-*.gguf`` for
the drafters that ggml-org's conversions publish apart from the model -- and llama.cpp's
``-hf`` picks them by name (common/download.cpp, ``find_best_sibling``).
So does elelem (:func:`elelem.model.hub.find_companion`).  Here, below the
native core, so that ``elelem pull`` fetches them without loading it;
:mod:`elelem.api.companions` applies them to a model's options.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional, Union

from ..errors import ElelemError, InvalidArgumentError, ModelNotFoundError
from ..gguf.reader import read_gguf
from .hf_reference import PROJECTOR
from .hub import ProgressFn, find_companion, is_hub_reference
from .projector import ARCHS_WITH_IMAGES

log = logging.getLogger("elelem")

#: ``draft_model``'s value that asks for the model's companion drafter.
AUTO = "auto"
#: The companion drafters elelem drafts with, by the prefix llama.cpp's converter names them
#: with, in the order llama.cpp's ``-hf`` prefers them when no speculative type is asked for
#: (common/arg.cpp: mtp, then dspark, then dflash, then eagle3): the MTP head
#: (elelem.model.mtp.is_companion), a DFlash drafter, an EAGLE-3 head.  DSpark files
#: (``dspark-``: DFlash with a Markov head) are not run here, so they are not fetched; nor
#: are Gemma 4 drafters, which llama.cpp picks by no file name (they are models of their
#: own repositories, given as ``draft_model``).
RUNNABLE_DRAFTERS = ("mtp-", "dflash-", "eagle3-")

ModelName = Union[str, "os.PathLike[str]", None]


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
            f", as llama.cpp's converter names the drafters published apart); name a draft model instead")
    log.info("%s: drafter %s", model, found.name)
    return found
