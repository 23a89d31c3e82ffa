"""Every exception elelem raises, in one hierarchy.

Each class derives from :class:`ElelemError` and from the builtin it refines,
so ``except ValueError`` in user code keeps working.
"""
from __future__ import annotations


class ElelemError(Exception):
    """Base class of every elelem error."""


class ModelNotFoundError(ElelemError, FileNotFoundError):
    """A model path that does not exist, or an unknown model name."""


class ModelDownloadError(ElelemError, RuntimeError):
    """A packaged model could not be fetched or failed its checksum."""


class GGUFError(ElelemError, ValueError):
    """A file that is not a valid GGUF file (bad header, metadata or tensor table)."""


class GGUFFormatError(GGUFError):
    """A GGUF problem at a known place: ``.field`` names it, ``.offset`` is its byte offset."""

    def __init__(self, message: str, *, field: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.field = field
        self.offset = offset


class GGUFHeaderError(GGUFFormatError):
    """Bad magic, unsupported version, or tensor/KV counts the file cannot hold."""


class GGUFMetadataError(GGUFFormatError):
    """A bad key-value pair: key, value type, string, array, alignment or tokenizer data."""


class GGUFTensorError(GGUFFormatError):
    """A bad tensor-info entry: name, shape, type, size or data offset."""


class GGUFTruncatedError(GGUFFormatError):
    """The file ends before a string, array, tensor-info entry or tensor data it declares."""


class UnsupportedArchitectureError(ElelemError, ValueError):
    """``general.architecture`` names an architecture elelem cannot run."""


class ModelShapeError(ElelemError, ValueError):
    """A missing tensor, a mis-shaped tensor, or hyperparameters that do not fit."""


class AdapterError(ElelemError, ValueError):
    """A LoRA adapter file that is not one, or is not for this model (architecture, weights, shapes)."""


class ContextLimitError(ElelemError, ValueError):
    """Evaluating would run past the end of the context window (``n_ctx``)."""


class KVCacheFullError(ContextLimitError):
    """The KV cache shared by all sequences has too few free cells for a step
    (see ``LLM(kv_size=...)``)."""


class StateError(ElelemError, ValueError):
    """A saved KV state that does not fit this model and cache, or a state
    file that is damaged, cut short, or made under other settings."""


class CapacityError(ElelemError, RuntimeError):
    """Every sequence slot of the engine is taken (see ``LLM(n_seq_max=...)``)."""


class InvalidTokenError(ElelemError, ValueError):
    """A token id outside ``[0, n_vocab)``."""


class InvalidArgumentError(ElelemError, ValueError):
    """An argument outside its allowed range (empty prompt, negative ``max_tokens``, ...)."""


class VocabularyMismatchError(InvalidArgumentError):
    """A draft model (``LLM(draft_model=...)``) whose vocabulary is not the target model's."""


class ClosedError(ElelemError, RuntimeError):
    """Use of a model or session after ``close()``."""


class ComputeError(ElelemError, RuntimeError):
    """ggml failed to allocate or compute a graph."""


class DeviceError(ElelemError, RuntimeError):
    """A GPU that was asked for explicitly (``n_gpu_layers``, ``main_gpu``,
    ``tensor_split``) and cannot be had: no GPU backend module, one that does
    not load or start, no such device.  Never a silent run on the CPU."""


class RPCError(ComputeError, ConnectionError):
    """An RPC server (``rpc_servers``) that cannot be reached, is not a ggml RPC
    server, or was lost or stopped answering; ``endpoints`` names the servers."""

    def __init__(self, message: str, *, endpoints: list[str] | None = None):
        super().__init__(message)
        self.endpoints = list(endpoints or [])


class TemplateError(ElelemError, ValueError):
    """A chat template that is invalid, unsafe, or too expensive to render."""


class UnsafeTemplateError(TemplateError):
    """A chat template that tried to reach outside its sandbox (Python internals, unsafe calls)."""


class TemplateLimitError(TemplateError):
    """A chat template that ran past a render limit: time, output size, recursion or range length."""


class GrammarError(InvalidArgumentError):
    """A ``grammar``, JSON schema or ``response_format`` that cannot be compiled into a
    token constraint; ``.param`` names the request field it came from."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class UnsupportedSchemaError(GrammarError):
    """A JSON-schema keyword (``.keyword``) the constraint engine cannot enforce.

    Raised instead of ignoring it: the output would otherwise satisfy a looser
    schema than the one asked for."""

    def __init__(self, message: str, *, keyword: str, param: str | None = None):
        super().__init__(message, param=param)
        self.keyword = keyword
