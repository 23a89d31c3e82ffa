"""One architecture, one module: the registry finds each by name, the
native structs are the declarations', and an architecture that brings a new
tensor role and a new hyperparameter is one module and one builder.

The toy architecture is the worked example of docs/models.md ("Adding an
architecture"), taken from the page itself so that the page and this test
cannot drift apart.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from elelem.errors import ModelShapeError, UnsupportedArchitectureError
from elelem.gguf.reader import read_gguf
from elelem.model import archs
from elelem.model.architectures import model_spec, supported_architectures
from elelem.model.archs import _codegen

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "models.md"
ARCHITECTURES = ("bert", "deepseek2", "dflash", "eagle3", "gemma3", "gemma4", "gemma4-assistant", "glm4moe", "gpt-oss",
                 "granitehybrid", "laguna", "lfm2", "lfm2moe", "llama", "minimax-m2", "mistral3", "nemotron_h",
                 "nemotron_h_moe", "nomic-bert", "nomic-bert-moe", "qwen2", "qwen2vl", "qwen3", "qwen35", "qwen35moe",
                 "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "seed_oss", "smollm3")


def doc_example(path: str) -> str:
    """The code block docs/models.md gives as the file ``path``."""
    match = re.search(rf"<!-- example file: {re.escape(path)} -->\n```[a-z]*\n(.*?)\n```", DOC.read_text(), re.S)
    assert match, f"docs/models.md has no example block for {path}"
    return match.group(1) + "\n"


def test_every_architecture_is_found_by_its_module_name():
    assert supported_architectures() == sorted(ARCHITECTURES)
    for name in ARCHITECTURES:
        assert archs.find(name).name == name
    # a module name that is not the GGUF name, a helper, a stranger: none is an architecture
    for name in ("gpt_oss", "nomic_bert", "minimax_m2", "_codegen", "Qwen2", "os", "../archspec", "archspec.roles", ""):
        assert archs.find(name) is None, name


def test_an_unknown_architecture_is_refused_with_the_supported_ones(tmp_path):
    path = tmp_path / "x.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2_family")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()
    with pytest.raises(UnsupportedArchitectureError, match=r"unsupported architecture 'qwen2_family'; supported: bert, "):
        model_spec(read_gguf(path))


def test_the_compiled_structs_are_the_declared_ones():
    core = pytest.importorskip("elelem._core")
    _codegen.check_core(core.LAYER_ROLES, core.layer_role_slots())
    assert set(core.HPARAM_NAMES) == set(archs.hparams())
    assert (ROOT / "elelem" / "_native" / "declarations.pxi").read_text() == _codegen.render()


def test_a_misordered_role_fails_the_check():
    core = pytest.importorskip("elelem._core")
    declared = dict(archs.layer_roles())
    names = list(declared)
    swapped = [names[1], names[0]] + names[2:]            # the declaration misordered against the struct
    with pytest.raises(RuntimeError, match="another order"):
        _codegen.check_core(core.LAYER_ROLES, core.layer_role_slots(), {n: declared[n] for n in swapped})
    slots = list(core.layer_role_slots())                 # a struct whose fields are not in LAYER_ROLES' order
    slots[2], slots[3] = slots[3], slots[2]
    with pytest.raises(RuntimeError, match=rf"misplaced: \['{names[2]}', '{names[3]}'\]"):
        _codegen.check_core(core.LAYER_ROLES, slots)
    with pytest.raises(RuntimeError, match=r"missing \['gone'\]"):  # a core built before a role was declared
        _codegen.check_core(core.LAYER_ROLES, core.layer_role_slots(),
                            dict(declared, gone=declared[names[0]]))


@pytest.fixture
def toy(tmp_path):
    """The worked example's module, in a folder added to the architecture package's path."""
    folder = tmp_path / "archs"
    folder.mkdir()
    (folder / "toy.py").write_text(doc_example("elelem/model/archs/toy.py"))
    archs.__path__.append(str(folder))
    archs.reset()
    try:
        yield folder
    finally:
        archs.__path__.remove(str(folder))
        sys.modules.pop("elelem.model.archs.toy", None)
        archs.reset()


def write_toy(path: Path, *, residual_scale=None, sub_norm_width=None) -> None:
    e, heads, kv, ff, vocab = 32, 4, 2, 64, 40
    head = e // heads
    writer = gguf.GGUFWriter(str(path), "toy")
    writer.add_context_length(256)
    writer.add_embedding_length(e)
    writer.add_block_count(2)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    writer.add_layer_norm_rms_eps(1e-5)
    if residual_scale is not None:
        writer.add_float32("toy.residual_scale", residual_scale)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, e), "output_norm.weight": (e,)}
    for i in range(2):
        shapes.update({f"blk.{i}.attn_norm.weight": (e,), f"blk.{i}.attn_q.weight": (e, e),
                       f"blk.{i}.attn_k.weight": (kv * head, e), f"blk.{i}.attn_v.weight": (kv * head, e),
                       f"blk.{i}.attn_output.weight": (e, e), f"blk.{i}.ffn_norm.weight": (e,),
                       f"blk.{i}.ffn_gate.weight": (ff, e), f"blk.{i}.ffn_up.weight": (ff, e),
                       f"blk.{i}.ffn_down.weight": (e, ff),
                       f"blk.{i}.attn_sub_norm.weight": (sub_norm_width or heads * head,)})
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file(); writer.write_kv_data_to_file(); writer.write_tensors_to_file(); writer.close()


def test_a_toy_architecture_is_one_module(toy, tmp_path):
    assert "toy" in supported_architectures()
    write_toy(tmp_path / "toy.gguf", residual_scale=0.25)
    spec = model_spec(read_gguf(tmp_path / "toy.gguf"))
    assert spec.arch.builder == "toy"
    assert spec.hparams["residual_scale"] == 0.25
    assert [t["attn_sub_norm"] for t in spec.layer_tensors] == ["blk.0.attn_sub_norm.weight",
                                                                "blk.1.attn_sub_norm.weight"]
    write_toy(tmp_path / "default.gguf")
    assert model_spec(read_gguf(tmp_path / "default.gguf")).hparams["residual_scale"] == 1.0
    write_toy(tmp_path / "bad.gguf", sub_norm_width=16)
    with pytest.raises(ModelShapeError, match=r"'blk.0.attn_sub_norm.weight' \(attn_sub_norm\) has shape \[16\]"):
        model_spec(read_gguf(tmp_path / "bad.gguf"))
    write_toy(tmp_path / "negative.gguf", residual_scale=-1.0)
    with pytest.raises(ModelShapeError, match="toy.residual_scale"):
        model_spec(read_gguf(tmp_path / "negative.gguf"))

    # The native declarations gain the field, the tuple entry and the default, and nothing else changes.
    text = _codegen.render()
    assert "    ggml_tensor * attn_sub_norm  # (n_head * head_dim_v)" in text
    assert "    float residual_scale  # multiplies each branch" in text
    assert '    hp.residual_scale = h.get("residual_scale", 1.0)' in text
    assert '    "attn_sub_norm",\n)' in text                          # last in LAYER_ROLES, as in the struct


def test_a_core_built_before_the_toy_was_declared_is_refused(toy):
    core = pytest.importorskip("elelem._core")
    with pytest.raises(RuntimeError, match=r"missing \['attn_sub_norm'\].*rebuild"):
        _codegen.check_core(core.LAYER_ROLES, core.layer_role_slots())


def cythonize(native: Path) -> subprocess.CompletedProcess:
    """Cython's compile of the core (to C++, not further): it reads every struct field a builder names."""
    for pattern, generated in (("arch_*.pxi", "all_builders.pxi"), ("vision_*.pxi", "all_vision_builders.pxi")):
        names = sorted(p.name for p in (native / "graph").glob(pattern))   # as setup.py's write_builder_includes
        (native / "graph" / generated).write_text("".join(f'include "{n}"\n' for n in names))
    return subprocess.run([sys.executable, "-m", "cython", "--cplus", "-3", "-o", str(native / "core.cpp"),
                           str(native / "core.pyx")], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_toy_builder_compiles_against_the_generated_structs(toy, tmp_path):
    pytest.importorskip("Cython")
    native = tmp_path / "_native"
    shutil.copytree(ROOT / "elelem" / "_native", native,
                    ignore=shutil.ignore_patterns("*.cpp", "*.so", "*.o", "all_builders.pxi", "all_vision_builders.pxi",
                                                  "declarations.pxi"))
    (native / "graph" / "arch_toy.pxi").write_text(doc_example("elelem/_native/graph/arch_toy.pxi"))
    _codegen.write(native / "declarations.pxi")
    result = cythonize(native)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "build_toy" in (native / "core.cpp").read_text()


def test_the_core_refuses_a_role_or_hyperparameter_it_was_built_without():
    core = pytest.importorskip("elelem._core")
    with pytest.raises(RuntimeError, match=r"built without attn_sub_norm.*rebuild"):
        core.open_model("/nonexistent.gguf", "decoder", {}, {}, [{"attn_sub_norm": "blk.0.attn_sub_norm.weight"}])
    with pytest.raises(RuntimeError, match=r"built without residual_scale.*rebuild"):
        core.open_model("/nonexistent.gguf", "decoder", {"residual_scale": 1.0}, {}, [])


def test_hyperparameters_are_checked_against_their_declarations():
    from elelem.model.archspec.hparams import check_hparams

    declared = archs.hparams()
    with pytest.raises(TypeError, match="'residual_scale' is set but declared by no architecture module"):
        check_hparams({"residual_scale": 1.0}, declared)
    with pytest.raises(TypeError, match="'n_swa' = 4.0 is not of its declared kind int"):
        check_hparams({"n_swa": 4.0}, declared)
    with pytest.raises(TypeError, match="'n_vocab' has no default and was not set"):
        check_hparams({}, declared)
