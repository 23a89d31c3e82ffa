"""Images in chat messages: content parts read, images encoded, and the
prompt's ids built around them as libmtmd builds them.

A message's image parts -- OpenAI's ``{"type": "image_url", "image_url":
{"url": ...}}``, the Responses API's ``{"type": "input_image", "image_url":
...}``, Anthropic's ``{"type": "image", "source": {"type": "base64", ...}}``
-- become libmtmd's media marker in the text the chat template renders (as
llama.cpp's server does).  The rendered text is then cut at the markers:
each piece of text is tokenized on its own, and each image becomes its
projector type's begin text, its embeddings (as negative ids,
elelem/engine/media.py) and its end text (mtmd_tokenize).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from ..engine.media import MediaTable
from ..errors import InvalidArgumentError
from ..model.projector import ARCHS_WITH_IMAGES
from ..vision.images import Image, ImageLimits, load
from ..vision.projector import Projector
from ..vision.slices import Piece
from ..vision.images import DEFAULT_MAX_BYTES, DEFAULT_MAX_PIXELS, b64decode, decode
from .options import VisionOptions
from .prompts import IMAGE_PART_TYPES

log = logging.getLogger("elelem")

#: libmtmd's default media marker (mtmd_default_marker): where an image goes in the rendered text.
MEDIA_MARKER = "<__media__>"


def image_source(part: Mapping[str, Any], where: str) -> str | bytes:
    """What an image content part points at: a URL or path (str), or the bytes of an Anthropic base64 block."""
    kind = part.get("type")
    if kind == "image":   # Anthropic
        source = part.get("source")
        if not isinstance(source, Mapping):
            raise InvalidArgumentError(f"{where}['source'] must be an object")
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            return b64decode(source["data"])
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return source["url"]
        raise InvalidArgumentError(f"{where}['source'] must be {{'type': 'base64', 'media_type': ..., "
                                   f"'data': ...}} or {{'type': 'url', 'url': ...}}")
    url = part.get("image_url")
    if isinstance(url, Mapping):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        raise InvalidArgumentError(f"{where}['image_url'] must be a URL string or {{'url': ...}}")
    return url


class ImageInput:
    """A model's projector, the limits on images, and the engine's table of
    image embeddings: what turns chat messages with images into a prompt."""

    def __init__(self, projector: Projector, media: MediaTable, limits: ImageLimits):
        self.projector = projector
        self.media = media
        self.limits = limits
        self._piece_ids: Optional[dict[bytes, int]] = None
        media.bidirectional = projector.spec.kind.attends_both_ways(projector.spec.n_embd_out)

    @classmethod
    def open(cls, options: VisionOptions, *, arch: str, n_embd: int, media: MediaTable,
             n_threads: int, n_deepstack: int = 0) -> Optional["ImageInput"]:
        if options.mmproj is None or isinstance(options.mmproj, bool):   # False: none (True is refused)
            return None
        if arch not in ARCHS_WITH_IMAGES:
            raise InvalidArgumentError(f"images into a {arch!r} model are not supported yet; elelem takes them into "
                                       f"{', '.join(ARCHS_WITH_IMAGES)}")
        projector = Projector(options.mmproj, n_threads=n_threads)
        try:
            projector.check_text_model(n_embd, n_deepstack)
        except BaseException:
            projector.close()
            raise
        limits = ImageLimits(
            max_bytes=options.image_max_bytes or DEFAULT_MAX_BYTES,
            max_pixels=options.image_max_pixels or DEFAULT_MAX_PIXELS,
            allowed_dir=None if options.image_dir is None else Path(options.image_dir),
            allow_http=bool(options.image_urls))
        return cls(projector, media, limits)

    def read(self, source: str | bytes) -> Image:
        return decode(source, self.limits) if isinstance(source, bytes) else load(source, self.limits)

    def marked_messages(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list, list[Image]]:
        """``messages`` with each image part made a text part holding the marker,
        and the images, decoded, in the order they appear."""
        images: list[Image] = []
        out = []
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list):
                out.append(message)
                continue
            parts = []
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
                    images.append(self.read(image_source(part, f"messages[{i}].content[{j}]")))
                    parts.append({"type": "text", "text": MEDIA_MARKER})
                else:
                    parts.append(part)
            out.append({**message, "content": parts})
        return out, images

    def model_prompt_ids(self, assets, text: str, images: Sequence[Image]) -> list[int]:
        """:meth:`prompt_ids` with the model's tokenizer (``assets``: elelem.api.assets.ModelAssets)."""
        tokenizer = assets.tokenizer
        return self.prompt_ids(
            lambda piece, first: assets.tokenize(piece, add_bos=None if first else False, special=True),
            tokenizer.bos_id, text, images,
            lambda piece: self.piece_id(piece, tokenizer.n_vocab, lambda i: tokenizer.decode([i], special=True)))

    def piece_id(self, text: str, n_vocab: int, piece: Callable[[int], bytes]) -> int:
        """The first id whose piece (``piece(id)``, control tokens as their text) is ``text``:
        mtmd_context::lookup_token, which puts the tokens between an image's slices.  The
        vocabulary is read once, at the first look-up."""
        if self._piece_ids is None:
            first: dict[bytes, int] = {}
            for i in range(n_vocab):
                first.setdefault(piece(i), i)
            self._piece_ids = first
        found = self._piece_ids.get(text.encode("utf-8"))
        if found is None:
            raise InvalidArgumentError(f"the vocabulary has no token {text!r}, which this "
                                       f"{self.projector.projector_type} projector puts between an image's slices")
        return found

    def prompt_ids(self, tokenize, bos_id: Optional[int], text: str, images: Sequence[Image],
                   piece_id: Optional[Callable[[str], int]] = None) -> list[int]:
        """The ids of the rendered ``text``: its pieces between markers tokenized
        one by one (``tokenize(text, first)``: with BOS for the first), each
        marker replaced by an image (mtmd_tokenize): the text around it and its
        embeddings, and for a sliced image (elelem.vision.slices) the tokens
        between its squares (``piece_id(text)``: the token whose piece is ``text``)."""
        pieces = text.split(MEDIA_MARKER)
        if len(pieces) - 1 != len(images):
            raise InvalidArgumentError(f"the prompt holds {len(pieces) - 1} image markers ({MEDIA_MARKER}) for "
                                       f"{len(images)} images")
        ids = list(tokenize(pieces[0], True))
        for image, piece in zip(images, pieces[1:]):
            encoded = self.projector.encode_image(image)
            for item in encoded.layout:
                if isinstance(item, int):
                    square = encoded.squares[item]
                    ids += self.media.add(square.digest, square.embeddings, square.grid)
                elif isinstance(item, Piece):
                    if piece_id is None:
                        raise InvalidArgumentError("a sliced image needs the vocabulary's tokens by their text")
                    ids.append(piece_id(item.text))
                elif item:
                    ids += tokenize(item, False)
            ids += tokenize(piece, False)
        if bos_id is not None and ids[:2] == [bos_id, bos_id]:
            ids = ids[1:]
        return ids

    def close(self) -> None:
        self.projector.close()
