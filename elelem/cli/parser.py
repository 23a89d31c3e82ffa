"""The argument parser: every command, option and check, in one place."""
from __future__ import annotations

import argparse
import math
import importlib
from typing import Callable

from .. import __version__
from ..errors import InvalidArgumentError
from ..model.hub import DEFAULT_MODEL

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elelem", description="Run GGUF language models locally.",
        epilog="Run 'elelem COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"elelem {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=0,
                        help="log progress to stderr (-vv: debug details)")

    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("-m", "--model", default=None, metavar="M",
                       help=f"a .gguf path, a known model name or hf://ORG/REPO[:QUANT] "
                            f"(default: {DEFAULT_MODEL}, pulled on first use)")
    model.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                       help="CPU threads (default: the CPUs available)")
    model.add_argument("-c", "--ctx", type=_positive_int, default=None, metavar="N",
                       help="context window in tokens (default: the model's, at most 4096)")
    model.add_argument("--no-mmap", dest="use_mmap", action="store_false",
                       help="read the weights into memory instead of mapping the file")
    model.add_argument("--no-repack", dest="repack", action="store_false",
                       help="use the weights as stored, without the CPU backend's repacked layouts "
                            "or elelem's Q8_0 copies of Q5_0 weights")
    model.add_argument("--no-amx", dest="amx", action="store_const", const=False, default=None,
                       help="never use AMX matmuls, on CPUs that have them")
    model.add_argument("--rpc", default=None, metavar="HOST:PORT,...", type=_rpc_servers,
                       help="split the layers over these 'elelem rpc-server's and this CPU")
    model.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto",
                       help="ggml's fused attention kernel (default auto, as llama.cpp: on where every device "
                            "holding K/V runs it; off: mul_mat + softmax, llama-cpp-python's default)")
    projector = model.add_mutually_exclusive_group()
    projector.add_argument("--mmproj", default=None, metavar="FILE",
                           help="the model's projector file (mmproj-*.gguf): chat requests may then carry images "
                                "(default: a model from Hugging Face comes with its repository's, as llama.cpp's -hf)")
    projector.add_argument("--no-mmproj", dest="mmproj", action="store_const", const=False,
                           help="no projector: do not fetch the one a Hugging Face repository ships")
    model.add_argument("--image-dir", default=None, metavar="DIR",
                       help="images may be read from local paths under DIR (default: none)")
    model.add_argument("--image-urls", action="store_true",
                       help="fetch http(s) image URLs (default: images come as data: URLs only)")
    _add_gpu_options(model)
    _add_lora_options(model)

    speculation = argparse.ArgumentParser(add_help=False)
    speculation.add_argument("--no-speculative", dest="speculative", action="store_false",
                             help="decode one token per step, without verifying drafted tokens "
                                  "(speculative decoding is on by default; the text is the same)")
    speculation.add_argument("--no-mtp", dest="mtp", action="store_false",
                             help="do not draft with the multi-token-prediction head the model file carries "
                                  "(Qwen3.5/3.6; used where the draft planner finds that it pays)")
    speculation.add_argument("--draft-model", "--draft", default=None, metavar="M",
                             help="draft with this smaller model of the same vocabulary (a .gguf path, a known "
                                  "name or hf://...) instead of prompt lookup, or with a drafter file (an "
                                  "mtp-*.gguf head, a DFlash or EAGLE-3 drafter, a Gemma 4 drafter); 'auto': "
                                  "the model's own companion (mtp-*, else dflash-*, else eagle3-*), from its "
                                  "Hugging Face repository or its folder")

    caching = argparse.ArgumentParser(add_help=False)
    caching.add_argument("--prompt-cache", default=None, metavar="DIR",
                         help="keep the KV state of evaluated prompts in DIR: a later prompt -- in this process "
                              "or another -- that shares a long prefix loads it instead of evaluating it")
    caching.add_argument("--prompt-cache-size", type=_byte_size, default=None, metavar="SIZE",
                         help="most bytes the prompt cache keeps, least recently used evicted first "
                              "(e.g. 500M, 4G; default 2G)")
    caching.add_argument("--state-cache-mb", type=_non_negative_int, default=None, metavar="MB",
                         help="memory a hybrid model (Qwen3.5, Qwen3-Next) keeps for conversations to resume "
                              "from without evaluating their history again: the recurrent state where each "
                              "prompt ended, least recently used evicted first (default 2048; 0: none)")

    generation = argparse.ArgumentParser(add_help=False)
    generation.add_argument("-n", "--max-tokens", type=_non_negative_int, default=None, metavar="N",
                            help="most tokens to generate (default: until the model stops or the context is full)")
    generation.add_argument("--temperature", type=float, default=None, metavar="T",
                            help="0 is greedy (default: 0.2 with a chat template, 0.8 with --raw)")
    generation.add_argument("--top-k", type=int, default=None, metavar="K", help="default 40; 0 disables")
    generation.add_argument("--top-p", type=float, default=None, metavar="P", help="default 0.95")
    generation.add_argument("--min-p", type=float, default=None, metavar="P", help="default 0.05")
    generation.add_argument("--repeat-penalty", type=float, default=None, metavar="R", help="default 1.0 (off)")
    generation.add_argument("--seed", type=int, default=None, metavar="S", help="same seed, same text")
    generation.add_argument("--stats", action="store_true",
                            help="print token counts and speed to stderr after each answer")

    run = commands.add_parser("run", parents=[common, model, speculation, caching, generation],
                              help="answer one prompt, streaming to stdout",
                              description="Answer PROMPT, streaming the text to stdout. Models with a chat "
                                          "template get the prompt as a user message; --raw continues the text.")
    run.add_argument("prompt", metavar="PROMPT", help="the prompt; '-' reads it from stdin")
    run.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    run.add_argument("--system", default=None, metavar="TEXT", help="a system message (chat template only)")
    run.add_argument("--image", action="append", default=None, metavar="FILE",
                     help="an image sent with the prompt (repeatable; needs --mmproj)")
    run.set_defaults(handler=_command("run"), command_parser=run)

    chat = commands.add_parser("chat", parents=[common, model, speculation, caching, generation],
                               help="talk with a model in the terminal",
                               description="An interactive chat. /reset starts over, /exit (or Ctrl-D) quits, "
                                           "Ctrl-C stops the current answer.")
    chat.add_argument("--system", default=None, metavar="TEXT", help="a system message")
    chat.set_defaults(handler=_command("chat"), command_parser=chat)

    info = commands.add_parser("info", parents=[common], help="describe a model file",
                               description="Architecture, size, context, vocabulary, quantization and chat "
                                           "template of a model, read from its GGUF header (nothing is loaded).")
    info.add_argument("model", metavar="MODEL", nargs="?",
                      help="a .gguf path, a known model name or hf://ORG/REPO[:QUANT]")
    info.add_argument("--system", action="store_true",
                      help="the CPU instead: the backend variant chosen, its features, repacking and AMX")
    info.add_argument("--devices", action="store_true",
                      help="the devices layers can run on, with their free memory (with --rpc: the servers' too)")
    info.add_argument("--rpc", default=None, metavar="HOST:PORT,...", type=_rpc_servers,
                      help="with --devices: also list these RPC servers' devices")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(handler=_command("info"))

    bench = commands.add_parser("bench", parents=[common, model], help="measure load, prefill and decode speed",
                                description="Load time, prefill tokens/s and decode tokens/s.")
    bench.add_argument("-p", "--prompt-tokens", type=_positive_int, default=512, metavar="N",
                       help="prefill a prompt of N tokens (default 512)")
    bench.add_argument("-g", "--gen-tokens", type=_positive_int, default=128, metavar="N",
                       help="decode N tokens, one at a time (default 128)")
    bench.add_argument("--json", action="store_true", help="machine-readable output")
    bench.set_defaults(handler=_command("bench"))

    serve = commands.add_parser("serve", parents=[common, speculation, caching],
                                help="serve models over an OpenAI-compatible HTTP API",
                                description="An OpenAI-compatible server (/v1/chat/completions, /v1/completions, "
                                            "/v1/models, /health, /metrics) of one model or several, the "
                                            "request's model choosing; needs pip install 'elelem[server]'.")
    serve.add_argument("-m", "--model", action="append", default=None, metavar="M",
                       help=f"a .gguf path, a known model name or hf://ORG/REPO[:QUANT]; repeat to serve "
                            f"several (default: {DEFAULT_MODEL})")
    serve.add_argument("--models-dir", default=None, metavar="DIR",
                       help="also serve every .gguf file below DIR, named by its file (without --model: "
                            "none is loaded before the first request)")
    serve.add_argument("--models-preset", default=None, metavar="FILE",
                       help="settings of their own for some models: an INI file of a [MODEL-ID] section each, "
                            "with ctx, parallel, threads, n-gpu-layers, main-gpu, flash-attn, speculative, "
                            "draft-model")
    serve.add_argument("--max-loaded", type=_positive_int, default=None, metavar="N",
                       help="keep at most N models loaded: the next unloads the least recently used idle one "
                            "(default: no limit)")
    serve.add_argument("--max-memory", type=_byte_size, default=None, metavar="SIZE",
                       help="keep at most this much of models' weights and KV caches loaded (e.g. 8G), "
                            "unloading as --max-loaded does (default: no limit)")
    serve.add_argument("--load-timeout", default="2m", metavar="T",
                       help="how long a request waits for another's load of its model, or for a loaded model "
                            "to give way to it, before a 503 (default 2m)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=_non_negative_int, default=8080, help="port (default 8080; 0 picks a free one)")
    serve.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY'")
    serve.add_argument("--parallel", type=_positive_int, default=8, metavar="N",
                       help="requests run at once per model, batched together (default 8); more get 503")
    serve.add_argument("-c", "--ctx", type=_positive_int, default=None, metavar="N",
                       help="context window of each request in tokens (default: the model's, at most 4096)")
    serve.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                       help="CPU threads (default: the CPUs available)")
    serve.add_argument("--keep-alive", default="5m", metavar="T",
                       help="unload a model after this long without requests (default 5m; -1: never)")
    serve.add_argument("--rpc", default=None, metavar="HOST:PORT,...", type=_rpc_servers,
                       help="split each model's layers over these 'elelem rpc-server's and this CPU")
    _add_gpu_options(serve)
    _add_lora_options(serve)
    serve.add_argument("--lora-init-without-apply", action="store_true",
                       help="load the LoRA adapters at scale 0 (set their scales later: POST /lora-adapters)")
    serve.add_argument("--no-flash-attn", dest="flash_attn", action="store_false",
                       help="attend with mul_mat + softmax, llama-cpp-python's default, instead of ggml's "
                            "fused kernel (on by default, as in llama.cpp's server: it skips the cells of "
                            "the other requests, which otherwise every token attends over)")
    serve.add_argument("--tool-call-format", default=None, metavar="NAME",
                       help="the format the models write tool calls in (hermes, qwen3_coder, harmony, mistral, "
                            "llama3, glm), for a chat template that does not show it (default: read from the "
                            "template)")
    serve_projector = serve.add_mutually_exclusive_group()
    serve_projector.add_argument("--mmproj", default=None, metavar="FILE",
                                 help="the projector file (mmproj-*.gguf) of the model (one --model): requests may "
                                      "then carry images, as data: URLs (the server fetches no URL unless "
                                      "--image-urls); a model from Hugging Face comes with its repository's")
    serve_projector.add_argument("--no-mmproj", dest="mmproj", action="store_const", const=False,
                                 help="no projectors: do not fetch those Hugging Face repositories ship")
    serve.add_argument("--image-urls", action="store_true",
                       help="let requests' images be http(s) URLs, which the server then fetches (default: off)")
    serve.add_argument("--grace", type=float, default=10.0, metavar="S",
                       help="on SIGTERM, seconds running requests may take to finish before they are cancelled")
    serve.set_defaults(handler=_command("serve"))

    rpc_server = commands.add_parser(
        "rpc-server", parents=[common], help="serve this machine's CPU to models split over RPC (--rpc)",
        description="Run ggml's RPC server: clients (elelem run --rpc HOST:PORT, LLM(rpc_servers=[...])) "
                    "place some of a model's layers here. One client at a time. The protocol has NO "
                    "authentication: keep it on loopback and tunnel it (ssh -L).")
    rpc_server.add_argument("--host", default="127.0.0.1",
                            help="IPv4 address to bind (default 127.0.0.1: this machine only)")
    rpc_server.add_argument("--port", type=_port, default=50052, help="port (default 50052, as llama.cpp's)")
    rpc_server.add_argument("-t", "--threads", type=_positive_int, default=None, metavar="N",
                            help="CPU threads (default: the CPUs available)")
    rpc_server.add_argument("--device", action="append", default=None, metavar="NAME",
                            help="a ggml device to serve (repeatable; default CPU; see elelem info --devices)")
    rpc_server.add_argument("--cache", default=None, metavar="DIR",
                            help="keep received weights in DIR, so a client that loads them again sends only hashes")
    rpc_server.add_argument("--allow-remote", action="store_true",
                            help="allow a --host other than loopback (anyone reaching it can use the server)")
    rpc_server.set_defaults(handler=_command("rpc_server"))

    models = commands.add_parser("models", parents=[common],
                                 help="list the known models and whether they are cached, "
                                      "and the Hugging Face models in its cache")
    models.set_defaults(handler=_command("models", "list_models"))

    pull = commands.add_parser("pull", parents=[common], help="download a model into the cache",
                               description="Download a known model, or a GGUF model from Hugging Face: "
                                           "hf://ORG/REPO[@REVISION][:QUANT], hf.co/ORG/REPO[:QUANT] or "
                                           "hf://ORG/REPO/FILE.gguf (the quant defaults to Q4_K_M, then Q8_0; "
                                           "split models come whole; needs pip install 'elelem[hub]').")
    pull.add_argument("name", metavar="NAME", help="a known model name (see 'elelem models') or hf://ORG/REPO[:QUANT]")
    pull.add_argument("--force", action="store_true", help="download again even if cached")
    pull.add_argument("--no-mmproj", dest="mmproj", action="store_false",
                      help="not the projector (mmproj-*.gguf) the repository ships for the model's images")
    pull.add_argument("--drafter", action="store_true",
                      help="also the drafter the repository ships (mtp-*.gguf, else dflash-*.gguf, else "
                           "eagle3-*.gguf), which --draft auto uses")
    pull.set_defaults(handler=_command("models", "pull"))

    rm = commands.add_parser("rm", parents=[common], help="remove a model from the cache",
                             description="Remove a known model, or a Hugging Face model (hf://ORG/REPO[:QUANT], "
                                         "as 'elelem models' lists it), from its cache.")
    rm.add_argument("name", metavar="NAME", help="a known model name or hf://ORG/REPO[:QUANT]")
    rm.set_defaults(handler=_command("models", "rm"))
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks argparse cannot express; a failure exits with status 2, like argparse's own."""
    parser = getattr(args, "command_parser", parser)  # so the usage line is the command's
    if hasattr(args, "temperature"):
        try:
            args.sampling = sampling_options(args)
            from ..sampling.sampler import SamplingParams
            SamplingParams(**args.sampling)  # the library's own range checks
        except InvalidArgumentError as error:
            parser.error(str(error))
    if getattr(args, "prompt", None) is not None and not args.prompt.strip():
        parser.error("the prompt is empty")
    if args.command == "info" and (args.model is not None) + args.system + args.devices != 1:
        parser.error("give a MODEL, --system or --devices")
    if args.command == "info" and args.rpc and not args.devices:
        parser.error("--rpc goes with --devices")


def sampling_options(args: argparse.Namespace) -> dict:
    """The sampling options the user gave; the rest keep the library's defaults."""
    return {name: getattr(args, name) for name in SAMPLING_OPTIONS if getattr(args, name) is not None}


def _command(module: str, function: str = "main") -> Callable:
    # Imported when run, so `elelem --help` does not load numpy and the native core.
    def handler(args):
        return getattr(importlib.import_module(f"{__package__}.{module}_cmd"), function)(args)
    return handler


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port in 1..65535, got {value}")
    return value


def _add_gpu_options(parser: argparse.ArgumentParser) -> None:
    gpu = parser.add_argument_group("GPU offload (llama.cpp's names)")
    gpu.add_argument("-ngl", "--n-gpu-layers", type=int, default=None, metavar="N",
                     help="layers on the GPU, counted from the last (default: every layer and the output head "
                          "when a GPU is present, else the CPU, logged; -1: all; 0: the CPU only). Asked for "
                          "with no GPU present, it is an error")
    gpu.add_argument("-mg", "--main-gpu", type=_non_negative_int, default=0, metavar="I",
                     help="the GPU that takes the layers (default 0: the best, CUDA or Metal before Vulkan); "
                          "'elelem info --devices' lists them")
    gpu.add_argument("-ts", "--tensor-split", type=_tensor_split, default=None, metavar="W,W,...",
                     help="split the layers over every GPU in these proportions (e.g. 3,1)")


class _LoraAction(argparse.Action):
    """--lora FNAME[,FNAME] (scale 1) and --lora-scaled FNAME:SCALE[,...], as llama.cpp's:
    (path, scale) pairs in the order given, both flags into one list."""

    def __call__(self, parser, namespace, values, option_string=None):
        adapters = list(getattr(namespace, self.dest) or [])
        for item in str(values).split(","):
            if option_string == "--lora":
                adapters.append((item, 1.0))
                continue
            path, sep, scale = item.rpartition(":")
            try:
                adapters.append((path, float(scale)))
            except ValueError:
                sep = ""
            if not sep or not path:
                parser.error(f"--lora-scaled takes FNAME:SCALE, got {item!r}")
        setattr(namespace, self.dest, adapters)


def _add_lora_options(parser: argparse.ArgumentParser) -> None:
    lora = parser.add_argument_group("LoRA adapters (llama.cpp's names)")
    lora.add_argument("--lora", action=_LoraAction, dest="lora", default=[], metavar="FNAME[,FNAME]",
                      help="a LoRA adapter (GGUF) applied at scale 1; repeat or separate by commas for several")
    lora.add_argument("--lora-scaled", action=_LoraAction, dest="lora", default=[], metavar="FNAME:SCALE[,...]",
                      help="a LoRA adapter applied at SCALE")


def _tensor_split(text: str) -> list[float]:
    try:
        weights = [float(w) for w in text.replace("/", ",").split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of numbers such as 3,1") from None
    if not weights or any(not (w >= 0 and math.isfinite(w)) for w in weights) or sum(weights) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give non-negative weights, not all 0")
    return weights


def _rpc_servers(text: str) -> list[str]:
    from ..api.devices import parse_endpoints  # no native core needed
    try:
        return parse_endpoints(text)
    except InvalidArgumentError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("rpc_servers: ")) from None


def _non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _byte_size(text: str) -> int:
    """A size in bytes: a number with an optional K, M, G or T (binary units; a trailing B or iB is allowed)."""
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = cleaned[-1:] if cleaned[-1:] in _SIZE_UNITS else ""
    try:
        value = float(cleaned[:len(cleaned) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 500M, 4G)") from None
    if not (math.isfinite(value) and value * _SIZE_UNITS[unit] >= 1):
        raise argparse.ArgumentTypeError(f"must be a positive size, got {text!r}")
    return int(value * _SIZE_UNITS[unit])
