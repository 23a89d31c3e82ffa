"""The files that come with a model (elelem.api.companions): a Hub repository's vision projector
(``mmproj-*``), pulled with its model as llama.cpp's ``-hf`` pulls it, and its drafter
(``mtp-*``, ``dflash-*``, ``eagle3-*``, in llama.cpp's order) with ``draft_model="auto"``; a local
file's drafter from its folder.

The choice of file is checked against the cases of llama.cpp's own test of it
(tests/test-model-resolution.cpp, on the same repository listings); the pulls run against the
stand-in Hub on loopback of tests/test_hub_hf.py, in a temporary Hugging Face cache.
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from elelem.model.hf_reference import DRAFTERS, PROJECTOR, choose_companion, choose_files, parse_reference

# -- which file, as llama.cpp picks it (no Hub) ---------------------------------------------

# The listings of llama.cpp's tests/test-model-resolution.cpp.
FLAT = ["README.md", "model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mmproj-model-BF16.gguf",
        "mmproj-model-Q8_0.gguf", "mtp-model-BF16.gguf", "mtp-model-Q4_0.gguf", "mtp-model-Q8_0.gguf",
        "dflash-model-BF16.gguf", "dflash-model-Q8_0.gguf"]
SUBDIR = ["mmproj-model-f16.gguf", "model-mtp-BF16.gguf", "model-mtp-Q8_0.gguf",
          "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf", "Q3_K_M/model-Q3_K_M-00002-of-00003.gguf",
          "Q3_K_M/model-Q3_K_M-00003-of-00003.gguf", "Q8_0/model-Q8_0-00001-of-00002.gguf",
          "Q8_0/model-Q8_0-00002-of-00002.gguf"]
HOLE = ["model-BF16.gguf", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "mtp-model-BF16.gguf", "mtp-model-Q4_0.gguf",
        "mtp-model-Q8_0.gguf", "dflash-model-BF16.gguf", "dflash-model-Q8_0.gguf"]
UNSLOTH = ["model-UD-Q8_K_XL.gguf", "mmproj-BF16.gguf", "model-MTP-BF16.gguf"]
QUAD = ["model-Q8_0.gguf", "mtp-model-Q8_0.gguf", "dflash-model-Q8_0.gguf", "eagle3-model-Q8_0.gguf",
        "dspark-model-Q8_0.gguf"]
SPARK = ["README.md", "model-MXFP4.gguf", "dspark-model-BF16.gguf", "dspark-model-MXFP4.gguf"]


@pytest.mark.parametrize("files, reference, model, mmproj, mtp, dflash, eagle3, dspark", [
    # the tag picks the model, and the drafters follow the tag; the projector follows the model's bits
    (FLAT, "hf://test/repo:Q8_0", "model-Q8_0.gguf", "mmproj-model-Q8_0.gguf", "mtp-model-Q8_0.gguf",
     "dflash-model-Q8_0.gguf", None, None),
    # no tag and no default quant: the first model; a suffix -MTP file is no drafter (case-sensitive)
    (UNSLOTH, "hf://test/repo", "model-UD-Q8_K_XL.gguf", "mmproj-BF16.gguf", None, None, None, None),
    (UNSLOTH, "hf://test/repo:Q8_K_XL", "model-UD-Q8_K_XL.gguf", "mmproj-BF16.gguf", None, None, None, None),
    # a split model in a folder finds the companions at the root
    (SUBDIR, "hf://test/repo:Q3_K_M", "Q3_K_M/model-Q3_K_M-00001-of-00003.gguf", "mmproj-model-f16.gguf",
     "model-mtp-Q8_0.gguf", None, None, None),
    # no tag: the drafters nearest the model's quant (Q4_K_M: Q4_0, then Q8_0 before BF16)
    (HOLE, "hf://test/repo", "model-Q4_K_M.gguf", None, "mtp-model-Q4_0.gguf", "dflash-model-Q8_0.gguf",
     None, None),
    (QUAD, "hf://test/repo:Q8_0", "model-Q8_0.gguf", None, "mtp-model-Q8_0.gguf", "dflash-model-Q8_0.gguf",
     "eagle3-model-Q8_0.gguf", "dspark-model-Q8_0.gguf"),
    (SPARK, "hf://test/repo", "model-MXFP4.gguf", None, None, None, None, "dspark-model-MXFP4.gguf"),
])
def test_companions_are_chosen_as_llama_cpp_chooses_them(files, reference, model, mmproj, mtp, dflash, eagle3,
                                                         dspark):
    ref = parse_reference(reference)
    for seed in range(4):   # whatever order the Hub lists the files in
        listing = random.Random(seed).sample(files, len(files))
        primary = choose_files(listing, ref)[0]
        assert primary == model
        assert choose_companion(listing, primary, PROJECTOR) == mmproj   # llama.cpp passes no tag for it
        drafters = [choose_companion(listing, primary, keyword, ref.quant) for keyword in DRAFTERS]
        assert drafters == [mtp, dspark, dflash, eagle3]


def test_a_companion_in_another_quants_folder_is_not_the_models():
    files = ["Q4_K_M/model-Q4_K_M.gguf", "Q8_0/model-Q8_0.gguf", "Q8_0/mmproj-model-f16.gguf"]
    assert choose_companion(files, "Q4_K_M/model-Q4_K_M.gguf", PROJECTOR) is None
    assert choose_companion(files, "Q8_0/model-Q8_0.gguf", PROJECTOR) == "Q8_0/mmproj-model-f16.gguf"


# -- pulled from the stand-in Hub, and opened ------------------------------------------------

pytest.importorskip("huggingface_hub")

import elelem  # noqa: E402
from elelem.cli import main  # noqa: E402
from elelem.errors import ElelemError, InvalidArgumentError, ModelNotFoundError  # noqa: E402
from elelem.gguf.reader import read_gguf  # noqa: E402
from elelem.model import hf  # noqa: E402
from elelem.model.mtp import is_companion  # noqa: E402
from hub_standin import Repo  # noqa: E402
from synthetic import TinyConfig, make_weights, write_model  # noqa: E402
from synthetic_mmproj import TinyProjector, write_projector  # noqa: E402
from test_hub_hf import COMMIT_A, cache, models, restore_elelem_logger, standin, storage, tiny_repo  # noqa: E402,F401

GEMMA = TinyConfig(arch="gemma3", n_embd=64, head_dim=32, n_layer=2, n_swa=8, tied=True)
QWEN = TinyConfig(arch="qwen35", head_dim=32, n_rot=16, n_layer=4, wtype="q8_0", seed=21, mtp="agree",
                  n_vocab=512)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A gemma3 text model with two projectors (F16 and Q8_0 in name, different weights), and a
    qwen35 model with its MTP head apart (as llama.cpp's converter publishes it, --mtp)."""
    tmp = tmp_path_factory.mktemp("companions")
    write_model(tmp / "vision.gguf", GEMMA)
    for name, seed in (("f16", 1), ("q8", 2)):
        write_projector(tmp / f"mmproj-{name}.gguf", TinyProjector(n_embd_out=GEMMA.n_embd, seed=seed))
    write_model(tmp / "qwen.gguf", QWEN)
    trunk = tuple(n for n in make_weights(QWEN) if n.startswith("blk.") and int(n.split(".")[1]) < QWEN.n_layer)
    write_model(tmp / "mtp.gguf", QWEN.but(drop=trunk))
    assert is_companion(read_gguf(tmp / "mtp.gguf"))
    return {p.stem: p.read_bytes() for p in tmp.glob("*.gguf")}


def vision_repo(files) -> Repo:
    return Repo("org/vision", {"Vision-Q8_0.gguf": files["vision"], "mmproj-Vision-F16.gguf": files["mmproj-f16"],
                               "mmproj-Vision-Q8_0.gguf": files["mmproj-q8"], "README.md": b"# vision\n"},
                commit=COMMIT_A)


def mtp_repo(files) -> Repo:
    return Repo("org/qwen", {"Qwen-Q8_0.gguf": files["qwen"], "mtp-Qwen-Q8_0.gguf": files["mtp"],
                             "mtp-Qwen-BF16.gguf": b"not the quant asked for"}, commit=COMMIT_A)


def fetched(standin, files) -> list[str]:
    """The names (in the listing) of the files the CDN sent."""
    by_digest = {hashlib.sha256(data).hexdigest(): name for name, data in files.items()}
    return sorted(by_digest.get(r["path"].rsplit("-", 1)[-1], "?") for r in standin.cdn_gets())


def _open(reference, **kw):
    return elelem.LLM(reference, n_ctx=64, n_threads=1, **kw)


def test_a_hub_model_comes_with_its_repositorys_projector(files, standin, cache):
    standin.add(vision_repo(files))
    snapshot = storage(cache, "org/vision") / "snapshots" / COMMIT_A
    with _open("hf://org/vision:Q8_0") as llm:
        assert llm.images is not None
        assert llm.images.projector.path == snapshot / "mmproj-Vision-Q8_0.gguf"   # the quant nearest the model's
    assert fetched(standin, files) == ["mmproj-q8", "vision"]
    standin.clear_log()
    with _open("hf://org/vision:Q8_0") as llm:     # both cached: nothing downloads again
        assert llm.images is not None
    assert standin.cdn_gets() == []


def test_no_projector_with_mmproj_false_or_for_a_text_only_architecture(files, models, standin, cache):
    standin.add(vision_repo(files))
    with _open("hf://org/vision:Q8_0", mmproj=False) as llm:
        assert llm.images is None
    assert fetched(standin, files) == ["vision"]
    # A repository whose model elelem takes no images into: its projector is not downloaded
    # (tiny_repo's is not even a GGUF), and the model opens as before.
    standin.add(tiny_repo(models))
    standin.clear_log()
    with _open("hf://org/tiny") as llm:
        assert llm.images is None
    assert len(standin.cdn_gets()) == 1
    assert not (storage(cache, "org/tiny") / "snapshots" / COMMIT_A / "mmproj-Tiny-Q4_K_M.gguf").exists()
    with pytest.raises(InvalidArgumentError, match="mmproj must be a path, None .* or False"):
        _open("hf://org/vision:Q8_0", mmproj=True)


def test_offline_the_cached_projector_comes_with_the_model(files, standin, cache, monkeypatch):
    import huggingface_hub.constants as constants
    standin.add(vision_repo(files))
    hf.pull_model("hf://org/vision:Q8_0")           # the model alone, as an older elelem pulled it
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with _open("hf://org/vision:Q8_0") as llm:      # offline, and no projector cached: text only
        assert llm.images is None
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with _open("hf://org/vision:Q8_0") as llm:
        assert llm.images is not None
    standin.stop()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with _open("hf://org/vision:Q8_0") as llm:
        assert llm.images.projector.path.name == "mmproj-Vision-Q8_0.gguf"


def test_the_cli_pulls_the_projector_and_the_drafter(files, standin, cache, capsys):
    standin.add(vision_repo(files))
    standin.add(mtp_repo(files))
    assert main(["pull", "hf://org/vision:Q8_0", "--no-mmproj"]) == 0
    assert [Path(p).name for p in capsys.readouterr().out.split()] == ["Vision-Q8_0.gguf"]
    assert main(["pull", "hf://org/vision:Q8_0"]) == 0
    assert [Path(p).name for p in capsys.readouterr().out.split()] == ["Vision-Q8_0.gguf", "mmproj-Vision-Q8_0.gguf"]
    assert main(["pull", "hf://org/qwen:Q8_0", "--drafter"]) == 0
    assert [Path(p).name for p in capsys.readouterr().out.split()] == ["Qwen-Q8_0.gguf", "mtp-Qwen-Q8_0.gguf"]
    assert main(["pull", "hf://org/vision:Q8_0", "--drafter"]) == 1
    err = capsys.readouterr().err
    assert "ships no drafter" in err and "mtp-*.gguf" in err and "Traceback" not in err


def test_draft_auto_drafts_with_the_repositorys_mtp_head(files, standin, cache):
    standin.add(mtp_repo(files))
    with _open("hf://org/qwen:Q8_0", speculative=False) as llm:
        plain = llm.generate_tokens([5, 9, 11, 2], 24)
    assert fetched(standin, files) == ["qwen"]
    # mtp=False: the head in the model's own file is not used, so a head is the companion's
    with _open("hf://org/qwen:Q8_0", draft_model="auto", mtp=False) as llm:
        assert llm.engine.mtp is not None and llm.engine.draft is None
        assert llm.generate_tokens([5, 9, 11, 2], 24) == plain
    assert fetched(standin, files) == ["mtp", "qwen"]       # the Q8_0 head, not the BF16 one


def dflash_files(tmp_path) -> dict[str, bytes]:
    """A bare llama target and a DFlash drafter for it (its own token table and output)."""
    from synthetic_dflash import DFlashConfig, write_dflash
    tmp_path.mkdir(parents=True, exist_ok=True)
    write_model(tmp_path / "llama.gguf", TinyConfig(arch="llama", n_layer=8, n_vocab=512, seed=71))
    write_dflash(tmp_path / "dflash.gguf", DFlashConfig(n_vocab=512, own=True, seed=72, block_size=4))
    return {p.stem: p.read_bytes() for p in tmp_path.glob("*.gguf")}


def test_draft_auto_drafts_with_the_repositorys_dflash_drafter(standin, cache, tmp_path):
    """A repository with a DFlash drafter and an EAGLE-3 head: the DFlash one, as llama.cpp's
    -hf prefers it (common/arg.cpp), in the model's quant."""
    from elelem.engine.dflash import DFlashHead
    blobs = dflash_files(tmp_path)
    standin.add(Repo("org/llama", {"Llama-Q8_0.gguf": blobs["llama"], "dflash-Llama-Q8_0.gguf": blobs["dflash"],
                                   "dflash-Llama-BF16.gguf": b"not the quant asked for",
                                   "eagle3-Llama-Q8_0.gguf": b"not the drafter llama.cpp prefers"},
                     commit=COMMIT_A))
    with _open("hf://org/llama:Q8_0", speculative=False) as llm:
        plain = llm.generate_tokens([5, 9, 11, 2], 24)
    with _open("hf://org/llama:Q8_0", draft_model="auto") as llm:
        assert isinstance(llm.engine.mtp, DFlashHead) and llm.engine.draft is None
        assert llm.generate_tokens([5, 9, 11, 2], 24) == plain
    assert fetched(standin, blobs) == ["dflash", "llama"]


def test_draft_auto_finds_a_dflash_drafter_beside_a_local_file(tmp_path):
    from elelem.engine.dflash import DFlashHead
    blobs = dflash_files(tmp_path / "made")
    (tmp_path / "Llama-Q4_K_M.gguf").write_bytes(blobs["llama"])
    (tmp_path / "dflash-Llama-Q8_0.gguf").write_bytes(blobs["dflash"])
    with _open(tmp_path / "Llama-Q4_K_M.gguf", draft_model="auto") as llm:
        assert isinstance(llm.engine.mtp, DFlashHead)


def test_draft_auto_finds_an_eagle3_head_beside_a_local_file(tmp_path):
    """No mtp- or dflash- file: the EAGLE-3 head, llama.cpp's last choice."""
    from elelem.engine.eagle3 import Eagle3Head
    from synthetic_eagle3 import Eagle3Config, write_eagle3_head
    blobs = dflash_files(tmp_path / "made")
    (tmp_path / "Llama-Q4_K_M.gguf").write_bytes(blobs["llama"])
    write_eagle3_head(tmp_path / "eagle3-Llama-Q8_0.gguf", Eagle3Config(n_vocab=512, n_vocab_draft=128, seed=73))
    with _open(tmp_path / "Llama-Q4_K_M.gguf", draft_model="auto") as llm:
        assert isinstance(llm.engine.mtp, Eagle3Head)
    (tmp_path / "dflash-Llama-Q8_0.gguf").write_bytes(blobs["dflash"])
    with _open(tmp_path / "Llama-Q4_K_M.gguf", draft_model="auto") as llm:
        assert type(llm.engine.mtp).__name__ == "DFlashHead"


def test_draft_auto_without_a_drafter_says_so(files, models, standin, cache, tmp_path):
    standin.add(tiny_repo(models))
    with pytest.raises(ModelNotFoundError, match=r"its Hugging Face repository ships no drafter .*mtp-\*\.gguf, "
                                                 r"dflash-\*\.gguf, eagle3-\*\.gguf"):
        _open("hf://org/tiny", draft_model="auto")
    (tmp_path / "Tiny-Q4_K_M.gguf").write_bytes(models["a"])
    with pytest.raises(ModelNotFoundError, match=f"{tmp_path} holds no drafter"):
        _open(tmp_path / "Tiny-Q4_K_M.gguf", draft_model="auto")
    with pytest.raises(InvalidArgumentError, match="draft_model='auto' looks for the drafter"):
        _open("smollm2-135m", draft_model="auto")


def test_draft_auto_finds_the_head_beside_a_local_file(files, tmp_path):
    """In a folder of several models and heads, the head named after the model."""
    for name in ("Qwen-Q4_K_M.gguf", "Other-Q4_K_M.gguf"):
        (tmp_path / name).write_bytes(files["qwen"])
    (tmp_path / "mtp-Qwen-Q8_0.gguf").write_bytes(files["mtp"])
    (tmp_path / "mtp-Other-Q4_0.gguf").write_bytes(b"another model's head")
    with _open(tmp_path / "Qwen-Q4_K_M.gguf", draft_model="auto", mtp=False) as llm:
        assert llm.engine.mtp is not None
    with pytest.raises(ElelemError, match="mtp-Other-Q4_0.gguf"):   # its own: not a GGUF
        _open(tmp_path / "Other-Q4_K_M.gguf", draft_model="auto", mtp=False)


def test_serve_gives_each_hub_model_its_companions(files, standin, cache):
    """``elelem serve -m hf://...``: the projector (and with --draft auto the drafter) of each
    model from the Hub, in that model's settings alone, beside the server's own options."""
    from elelem.cli.parser import build_parser
    from elelem.cli.serve_cmd import _llm_options, _pull
    from elelem.server import ServerConfig
    standin.add(vision_repo(files))
    standin.add(mtp_repo(files))
    args = build_parser().parse_args(["serve", "-m", "hf://org/vision:Q8_0", "-m", "hf://org/qwen:Q8_0",
                                      "--draft", "auto", "--image-urls"])
    presets: dict = {}
    with pytest.raises(ModelNotFoundError, match="ships no drafter"):   # --draft auto for every model
        _pull("hf://org/vision:Q8_0", args, presets)
    args.draft_model = None
    vision = _pull("hf://org/vision:Q8_0", args, presets)
    args.draft_model = "auto"
    qwen = _pull("hf://org/qwen:Q8_0", args, presets)
    config = ServerConfig(models=[vision, qwen], llm_options=_llm_options(args), presets=presets)
    options = config.for_model("Vision-Q8_0", vision).model_options(64)
    assert Path(options["vision"].mmproj).name == "mmproj-Vision-Q8_0.gguf" and options["vision"].image_urls
    options = config.for_model("Qwen-Q8_0", qwen).model_options(64)
    assert options["vision"].mmproj is None and Path(options["speculation"].draft_model).name == "mtp-Qwen-Q8_0.gguf"
    args = build_parser().parse_args(["serve", "-m", "hf://org/vision:Q8_0", "--no-mmproj"])
    presets = {}
    _pull("hf://org/vision:Q8_0", args, presets)
    assert ServerConfig(models=[vision], llm_options=_llm_options(args), presets=presets).for_model(
        "Vision-Q8_0", vision).model_options(64)["vision"].mmproj is False
