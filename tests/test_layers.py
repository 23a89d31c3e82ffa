"""elelem's layers: each layer imports only the layers below it, and no
module imports itself back, counting imports under TYPE_CHECKING and inside functions.

Both checks read the source tree next to this file (not an installed copy), in a
subprocess whose path starts at the repository root.  The layers themselves are
the import-linter contracts in pyproject.toml ([tool.importlinter]): the layers of
the package, and within elelem.model the architecture modules (none importing
another) over what they share.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Prints the strongly connected components of elelem's import graph that have more
# than one module: each is a set of modules that import each other in a loop.
_FIND_CYCLES = """
import json, grimp
graph = grimp.build_graph("elelem", exclude_type_checking_imports=False, cache_dir=None)
index, low, on_stack, stack, cycles = {}, {}, set(), [], []
def visit(root):  # Tarjan's algorithm, iterative: the graph may grow deep
    work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
    index[root] = low[root] = len(index); stack.append(root); on_stack.add(root)
    while work:
        module, children = work[-1]
        child = next(children, None)
        if child is None:
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop(); on_stack.discard(member); component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
        elif child not in index:
            index[child] = low[child] = len(index); stack.append(child); on_stack.add(child)
            work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
        elif child in on_stack:
            low[module] = min(low[module], index[child])
for module in sorted(graph.modules):
    if module not in index:
        visit(module)
print(json.dumps({"modules": len(graph.modules), "cycles": sorted(cycles)}))
"""


def _run_at_repo_root(argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_layers_contract_is_kept():
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    assert Path(lint_imports).exists(), "lint-imports is missing: pip install -e '.[test]' (import-linter)"
    result = _run_at_repo_root([lint_imports, "--no-cache"])
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert ", 0 broken" in output and " kept" in output, output  # elelem's layers, its server's, its model's


def _import_cycles() -> dict:
    result = _run_at_repo_root([sys.executable, "-c", _FIND_CYCLES])
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_no_import_cycles():
    found = _import_cycles()
    assert found["modules"] > 40, found  # the whole package was read, not an empty stand-in
    assert found["cycles"] == [], "modules that import each other in a loop:\n" + "\n".join(
        " <-> ".join(cycle) for cycle in found["cycles"])
