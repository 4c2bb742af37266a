"""The layout of the train job: one package, ``flodl_hf/job/``, that the engine never imports.

Read with ``ast`` over the source files (nothing is imported), so the rule holds for lazy imports inside functions
too: only ``flodl_hf/cli.py`` (the composition root) and the examples import ``flodl_hf.job``; tests may.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = "flodl_hf.job"
#: The engine: the multi-device runtime, which must run without the train job.
ENGINE = ["flodl_hf/distributed", "flodl_hf/builder", "flodl_hf/graph.py", "flodl_hf/trainer.py",
          "flodl_hf/el_che.py", "flodl_hf/config.py"]
#: The only importers of the job package outside tests: the CLI, and the job of the other tasks (``flodl_hf/tasks``,
#: which reuses the job's parts and is itself imported by the CLI alone).
ALLOWED = {"flodl_hf/cli.py"}
TASKS_DIR = "flodl_hf/tasks"
JOB_MODULES = ["settings", "run", "preflight", "schedule", "loop", "checkpoints", "evaluate", "problems", "outputs"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(source: str, path: Path) -> set[str]:
    """Every module an import statement of ``source`` names (relative imports resolved, ``from X import y``
    counted as both ``X`` and ``X.y``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if package else []
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _imports_job(path: Path, source: str | None = None) -> bool:
    modules = _imported(source if source is not None else path.read_text(encoding="utf-8"), path)
    return any(m == JOB or m.startswith(JOB + ".") for m in modules)


def _python_files(*tops: str) -> list[Path]:
    files: list[Path] = []
    for top in tops:
        path = ROOT / top
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return files


def test_the_resolver_sees_relative_and_lazy_imports():
    cli = ROOT / "flodl_hf" / "cli.py"
    assert _imports_job(cli)
    assert _imports_job(ROOT / "flodl_hf" / "x.py", "def f():\n    from .job.run import run_train\n")
    assert _imports_job(ROOT / "flodl_hf" / "builder" / "x.py", "from .. import job\n")
    assert _imports_job(ROOT / "flodl_hf" / "builder" / "x.py", "from ..job import loop\n")
    assert not _imports_job(ROOT / "flodl_hf" / "builder" / "x.py", "from .job import loop\n")  # builder.job
    assert _imports_job(ROOT / "examples" / "x.py", "import flodl_hf.job.settings\n")


def test_the_engine_never_imports_the_job_package():
    offenders = [str(p.relative_to(ROOT)) for p in _python_files(*ENGINE) if _imports_job(p)]
    assert offenders == []


def test_only_the_cli_and_the_examples_import_the_job_package():
    files = [p for p in _python_files("flodl_hf", "heads", "model_cards", "benchmarks", "scripts")
             if not p.is_relative_to(ROOT / "flodl_hf" / "job")]
    offenders = [str(p.relative_to(ROOT)) for p in files if str(p.relative_to(ROOT)) not in ALLOWED
                 and not p.is_relative_to(ROOT / TASKS_DIR) and _imports_job(p)]
    assert offenders == []


def _imports(path: Path, package: str) -> bool:
    return any(m == package or m.startswith(package + ".") for m in _imported(path.read_text(encoding="utf-8"), path))


def test_only_the_cli_imports_the_tasks_package_and_it_never_imports_heads():
    files = [p for p in _python_files("flodl_hf", "heads", "model_cards", "benchmarks", "scripts")
             if not p.is_relative_to(ROOT / TASKS_DIR)]
    assert [str(p.relative_to(ROOT)) for p in files
            if str(p.relative_to(ROOT)) not in ALLOWED and _imports(p, "flodl_hf.tasks")] == []
    tasks = _python_files(TASKS_DIR)
    assert tasks and [str(p.relative_to(ROOT)) for p in tasks if _imports(p, "heads")] == []
    for path in tasks:
        source = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source))
        assert doc and ("It exists" in doc or path.stem == "__init__"), f"{path.name}: say why it exists"
        assert len(source.splitlines()) <= 500 and "__all__" in source, path.name


def test_the_job_package_has_one_documented_module_per_concern():
    package = ROOT / "flodl_hf" / "job"
    names = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert names == sorted(JOB_MODULES)
    for path in package.glob("*.py"):
        source = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source))
        assert doc and ("It exists" in doc or path.stem == "__init__"), f"{path.name}: say why it exists"
        assert len(source.splitlines()) <= 500, path.name
    init = (package / "__init__.py").read_text(encoding="utf-8")
    assert not [n for n in ast.parse(init).body if isinstance(n, (ast.Import, ast.ImportFrom))]  # imports nothing


def test_the_old_top_level_job_modules_are_gone():
    for name in ("jobs", "job_checkpoints", "training_loop", "reporting", "best_model", "evaluation", "problem"):
        assert not (ROOT / "flodl_hf" / f"{name}.py").exists(), name
