"""The layers of the code, read from the source with ``ast`` (nothing is imported), so imports inside functions count
as much as the ones at the top of a module; only type-only imports under ``if TYPE_CHECKING:`` are left out.

The rules, each a test below:

* no import cycle between any two modules of ``flodl_hf``, ``heads`` and ``model_cards``;
* each module imports only its own layer or layers below it (``LAYERS``: foundations, engine, products, heads,
  jobs, the CLI);
* the heads never import the engine's distributed code (``torch.distributed``, ``flodl_hf.distributed``,
  ``flodl_hf.builder``);
* El Che's scheduler core imports nothing outside the standard library, even transitively;
* the CLI is the only composition root: it alone joins the heads and the train job, and nothing imports it but
  ``python -m flodl_hf``;
* comments and docstrings say why, not when: no issue number in the project's Python or shell sources (the history
  belongs in commits and issue notes, where it stays true).

The resolver and the rules are themselves tested on small made-up sources, so a rule cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parents[3]
TOPS = ("flodl_hf", "heads", "model_cards")

#: Layers, lowest first; a module's layer is that of the longest prefix listed. A module may import its own layer
#: and the layers below it, never above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundations", ("flodl_hf.config", "flodl_hf.defaults", "flodl_hf.quiet", "flodl_hf.diagnostics",
                     "flodl_hf.preflight", "flodl_hf.files", "flodl_hf.elche", "flodl_hf.checkpoint",
                     "flodl_hf.data", "flodl_hf.metrics", "model_cards")),
    ("engine", ("flodl_hf.distributed", "flodl_hf.checkpoint.graph_state", "flodl_hf.graph", "flodl_hf.epoch_order",
                "flodl_hf.replica", "flodl_hf.trainer", "flodl_hf.builder")),
    ("products", ("flodl_hf.export", "flodl_hf.integrations")),
    ("heads", ("heads",)),
    ("jobs", ("flodl_hf.job", "flodl_hf.bench")),
    ("cli", ("flodl_hf.cli", "flodl_hf.__main__", "flodl_hf")),  # ``flodl_hf`` itself: the lazy public facade
]
#: El Che's scheduler core: pure Python (the torch-side ``partition`` and ``memory_probe`` sit beside it).
ELCHE_CORE = ("flodl_hf.elche", "flodl_hf.elche.scheduler", "flodl_hf.elche.split", "flodl_hf.elche.goodput",
              "flodl_hf.elche.noise_scale")
DISTRIBUTED = ("torch.distributed", "flodl_hf.distributed", "flodl_hf.builder")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            hidden.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return hidden


def _lazy_exports() -> dict[str, str]:
    """``flodl_hf``'s lazily resolved public names -> the module each comes from (``_EXPORTS``, read with ast)."""
    tree = ast.parse((ROOT / "flodl_hf" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["_EXPORTS"]:
            return ast.literal_eval(node.value)
    raise AssertionError("flodl_hf/__init__.py has no _EXPORTS table: the layering test cannot follow its names")


#: Modules that import by a computed name (a user's module, a plug-in chosen at run time): each call is named here.
DYNAMIC_IMPORTERS = {"flodl_hf", "flodl_hf.cli.convert", "flodl_hf.bench.harness"}


def imported(source: str, name: str, is_package: bool, modules: Iterable[str] = (),
             exports: Optional[dict[str, str]] = None) -> set[str]:
    """Every module an import statement of ``source`` (module ``name``) names, relative imports resolved.
    ``from X import y`` counts as ``X.y`` when that is one of ``modules``, as the module ``y`` comes from when ``X``
    is ``flodl_hf`` and ``y`` one of its lazy ``exports``, else as ``X`` (``y`` is a name in it). A call of
    ``importlib.import_module`` / ``__import__`` with a literal name counts as importing it; with a computed name
    it is refused outside ``DYNAMIC_IMPORTERS``."""
    modules = set(modules)
    exports = _lazy_exports() if exports is None else exports
    package = name if is_package else name.rpartition(".")[0]
    tree = ast.parse(source)
    hidden = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level > len(parts):
                    raise AssertionError(f"{name}: a relative import reaches above the top package: "
                                         f"{ast.unparse(node)}")
                base = parts[:len(parts) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                if f"{module}.{alias.name}" in modules:
                    found.add(f"{module}.{alias.name}")
                elif module == "flodl_hf" and alias.name in exports:
                    found.add(exports[alias.name])
                elif not (module == "flodl_hf" and alias.name == "__version__"):  # a constant of the package
                    found.add(module)
        elif isinstance(node, ast.Call):
            callee = ast.unparse(node.func)
            if callee in ("importlib.import_module", "import_module", "__import__") and node.args:
                target = node.args[0]
                if isinstance(target, ast.Constant) and isinstance(target.value, str):
                    found.add(target.value)
                elif name not in DYNAMIC_IMPORTERS:
                    raise AssertionError(f"{name} imports a computed module name ({ast.unparse(node)}): import "
                                         "it by name, or add the module to DYNAMIC_IMPORTERS saying why")
    if name == "flodl_hf":
        found.update(exports.values())  # the package resolves its public names from these modules on demand
    return found


def _sources() -> dict[str, tuple[Path, str]]:
    found = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[_module_name(path)] = (path, path.read_text(encoding="utf-8"))
    return found


def import_graph(sources: Optional[dict[str, tuple[Path, str]]] = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in its source), plus ``"<external>:NAME"`` entries for
    everything else it imports. A package is always imported before its own modules, so a module's edge to a
    package that contains it is not counted (``from . import launch`` depends on ``launch``, not on its package)."""
    sources = _sources() if sources is None else sources
    exports = _lazy_exports()
    graph: dict[str, set[str]] = {}
    for name, (path, source) in sources.items():
        edges: set[str] = set()
        for module in imported(source, name, path.name == "__init__.py", sources, exports):
            if module.partition(".")[0] not in TOPS:
                edges.add("<external>:" + module)
            elif module != name and not name.startswith(module + "."):
                edges.add(module)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(module: str) -> int:
    best, level = -1, None
    for number, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "flodl_hf"  # the bare package: itself only
            if (module == prefix or inside) and len(prefix) > best:
                best, level = len(prefix), number
    if level is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/unit/project/test_layout.py")
    return level


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
            for a, edges in sorted(graph.items()) for b in sorted(edges)
            if not b.startswith("<external>") and layer_of(b) > layer_of(a)]


def _closure(graph: dict[str, set[str]], roots: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        todo.extend(graph.get(node, ()))
    return seen


def impure_elche(graph: dict[str, set[str]]) -> list[str]:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    reached = _closure(graph, [m for m in ELCHE_CORE if m in graph])
    return sorted(m for m in reached if m.startswith("<external>:") and m.split(":")[1].split(".")[0] not in stdlib
                  or not m.startswith("<external>") and not m.startswith(ELCHE_CORE))


def _imports_any(edges: set[str], prefixes: Iterable[str]) -> bool:
    names = [e.removeprefix("<external>:") for e in edges]
    return any(n == p or n.startswith(p + ".") for n in names for p in prefixes)


def heads_into_distributed(graph: dict[str, set[str]]) -> list[str]:
    return sorted(m for m, edges in graph.items() if m.split(".")[0] == "heads" and _imports_any(edges, DISTRIBUTED))


def composition_roots(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside the CLI that import the heads and the job, or that import the CLI."""
    bad = []
    for module, edges in sorted(graph.items()):
        in_cli = module == "flodl_hf.cli" or module.startswith("flodl_hf.cli.")
        if in_cli:
            continue
        if module.startswith("flodl_hf") and _imports_any(edges, ["heads"]):
            bad.append(f"{module} imports heads")
        if not module.startswith("flodl_hf.job") and _imports_any(edges, ["flodl_hf.job"]):
            bad.append(f"{module} imports the train job")
        if module != "flodl_hf.__main__" and _imports_any(edges, ["flodl_hf.cli"]):
            bad.append(f"{module} imports the CLI")
    return bad


# --- the rules on the real code -------------------------------------------------------------------------------------

def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_import_goes_to_the_same_layer_or_below():
    assert upward_imports(import_graph()) == []


def test_heads_never_import_distributed_code():
    assert heads_into_distributed(import_graph()) == []


def test_el_che_core_is_pure_python():
    graph = import_graph()
    assert all(m in graph for m in ELCHE_CORE)
    assert impure_elche(graph) == []


def test_the_cli_is_the_only_composition_root():
    assert composition_roots(import_graph()) == []


def test_the_top_level_reads_like_the_design():
    flat = sorted(p.stem for p in (ROOT / "flodl_hf").glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(flat) <= 10, flat
    for path in (ROOT / "flodl_hf").rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        source = path.read_text(encoding="utf-8")
        assert ast.get_docstring(ast.parse(source)), f"{path.relative_to(ROOT)}: a docstring says why it exists"


#: Where the project's own sources live (the code, its tests, scripts, examples and benchmarks).
SOURCE_DIRS = ("flodl_hf", "heads", "model_cards", "tests", "scripts", "examples", "benchmarks")
_ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? #?\d+")


def issue_numbers(files: Iterable[tuple[str, str]]) -> list[str]:
    """``path:line`` of every mention of an issue by number in the given (name, text) sources."""
    return [f"{name}:{n}" for name, text in files for n, line in enumerate(text.splitlines(), 1)
            if _ISSUE_NUMBER.search(line)]


def _own_sources() -> Iterable[tuple[str, str]]:
    for top in SOURCE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts:
                yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def test_comments_say_why_not_when():
    assert issue_numbers(_own_sources()) == []


# --- the checker checks: each rule fails on a made-up violation ----------------------------------------------------

def test_an_issue_number_in_a_comment_or_docstring_is_found():
    word = "issue"
    made_up = [("a.py", f'"""Why.\n\nMeasured ({word} 30): x."""\nx = 1  # {word.title()} #7 fixed this\n'),
               ("b.sh", "# the issues it closes are in the commit\n")]
    assert issue_numbers(made_up) == ["a.py:3", "a.py:4"]

def _fake(**modules: str) -> dict[str, tuple[Path, str]]:
    out = {}
    for dotted, source in modules.items():
        name = dotted.replace("__", ".")
        is_package = name in ("flodl_hf", "heads") or name.endswith(".pkg")
        path = ROOT / Path(*name.split(".")) / "__init__.py" if is_package else ROOT / (name.replace(".", "/") + ".py")
        out[name] = (path, source)
    return out


def test_the_resolver_sees_relative_lazy_and_package_imports_but_not_type_checking():
    assert imported("def f():\n    from .job.run import run_train\n", "flodl_hf.x", False) == {"flodl_hf.job.run"}
    assert imported("from .. import job\n", "flodl_hf.builder.x", False, ["flodl_hf.job"]) == {"flodl_hf.job"}
    assert imported("from .job import loop\n", "flodl_hf.builder.x", False) == {"flodl_hf.builder.job"}
    assert imported("from .split import f\n", "flodl_hf.elche", True) == {"flodl_hf.elche.split"}
    assert imported("from . import launch, x\n", "flodl_hf.d.c", False, ["flodl_hf.d.launch"]) == {
        "flodl_hf.d.launch", "flodl_hf.d"}
    hidden = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .graph import Graph\n"
    assert "flodl_hf.graph" not in imported(hidden, "flodl_hf.checkpoint", False)


def test_a_cycle_through_a_function_level_import_is_found():
    graph = import_graph(_fake(flodl_hf__a="from . import b\n", flodl_hf__b="def f():\n    from .a import x\n",
                               flodl_hf__c="from .a import y\n"))
    assert cycles(graph) == [["flodl_hf.a", "flodl_hf.b"]]
    assert cycles(import_graph(_fake(flodl_hf__a="from . import b\n", flodl_hf__b="x = 1\n"))) == []


def test_an_upward_import_is_found():
    graph = import_graph(_fake(flodl_hf__graph="def f():\n    from .job import run\n", flodl_hf__job__run="x = 1\n"))
    assert upward_imports(graph) == ["flodl_hf.graph (engine) imports flodl_hf.job.run (jobs)"]


def test_heads_importing_torch_distributed_or_the_builder_is_found():
    graph = import_graph(_fake(heads__x="import torch.distributed as dist\n",
                               heads__y="def f():\n    from flodl_hf.builder import step\n", heads__z="import torch\n"))
    assert heads_into_distributed(graph) == ["heads.x", "heads.y"]


def test_torch_reached_from_the_scheduler_core_is_found():
    graph = import_graph(_fake(flodl_hf__elche__scheduler="from .split import f\nimport math\n",
                               flodl_hf__elche__split="from ..helper import g\n",
                               flodl_hf__helper="import torch\n"))
    assert impure_elche(graph) == ["<external>:torch", "flodl_hf.helper"]


def test_a_second_composition_root_is_found():
    graph = import_graph(_fake(flodl_hf__bench__x="from heads import Auto\n",
                               flodl_hf__export__y="def f():\n    import flodl_hf.cli\n",
                               flodl_hf__cli__z="from heads import Auto\nfrom ..job import run\n"))
    assert composition_roots(graph) == ["flodl_hf.bench.x imports heads", "flodl_hf.export.y imports the CLI"]


def test_imports_through_the_package_facade_importlib_and_not_type_checking_are_seen():
    graph = import_graph(_fake(flodl_hf__data__x="def f():\n    from .. import Trainer\n",
                               flodl_hf__elche__scheduler="from flodl_hf import Trainer\n",
                               flodl_hf__export__y="import importlib\nm = importlib.import_module('flodl_hf.job.run')\n",
                               flodl_hf__files__z="from typing import TYPE_CHECKING\nif not TYPE_CHECKING:\n"
                                                  "    from ..graph import Graph\n",
                               flodl_hf__trainer="import torch\n", flodl_hf__graph="x = 1\n",
                               flodl_hf__job__run="x = 1\n", flodl_hf__checkpoint__v="from .. import __version__\n"))
    assert upward_imports(graph) == [
        "flodl_hf.data.x (foundations) imports flodl_hf.trainer (engine)",
        "flodl_hf.elche.scheduler (foundations) imports flodl_hf.trainer (engine)",
        "flodl_hf.export.y (products) imports flodl_hf.job.run (jobs)",
        "flodl_hf.files.z (foundations) imports flodl_hf.graph (engine)"]
    assert impure_elche(graph) == ["<external>:torch", "flodl_hf.trainer"]
    assert graph["flodl_hf.checkpoint.v"] == set()  # the package's version constant is no dependency


def test_a_computed_import_or_a_relative_import_past_the_top_is_refused():
    import pytest

    with pytest.raises(AssertionError, match="computed module name"):
        imported("import importlib\nimportlib.import_module(name)\n", "flodl_hf.data.x", False)
    with pytest.raises(AssertionError, match="above the top package"):
        imported("from ... import job\n", "flodl_hf.x", False)
