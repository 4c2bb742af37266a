"""Rule 4 of the third hostile round: an error's fix names only options that exist.

The hostile sweep (``tests/e2e/cli/test_hostile_inputs.py``) checks every refusal it provokes against the parser of the
command that was run; this test covers the messages no case reaches: every string of the command line's code path
(``flodl_hf`` but the engine's setup-mode and builder messages, which name Python arguments, and ``heads``) that
names a ``--option`` names one of some ``flodl-hf`` command (or of ``flodl-hf bench``), and a message of the CLI's
own modules that names a Python argument of the heads (``doc_stride``, ``num_labels``) is refused.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from flodl_hf.bench.cli import build_parser as bench_parser
from flodl_hf.bench.simulate_cli import build_parser as simulate_parser
from flodl_hf.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[3]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: Options of other programs a message may quote (pip, torchrun, the Hub's CLI).
FOREIGN = {"--force-reinstall", "--no-deps", "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
           "--master-port", "--upgrade", "--help", "--trust-remote-code", "--nproc_per_node", "--rdzv-endpoint",
           "--rdzv-backend", "--standalone", "--index-url", "--extra-index-url", "--label"}  # run_ner.py's



def _options(parser) -> set:
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action.choices, dict):
            found.update(o for sub in action.choices.values() if hasattr(sub, "_actions") for o in _options(sub))
    return found


def _strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a module (the literal parts of f-strings too), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
    return out


def _raised(path: Path) -> list[tuple[int, str]]:
    """The string parts of every ``raise X(...)`` message of a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            out += [(part.lineno, part.value) for part in ast.walk(node.exc)
                    if isinstance(part, ast.Constant) and isinstance(part.value, str)]
    return out


def _modules() -> list[Path]:
    skip = ("flodl_hf/builder/", "flodl_hf/distributed/", "flodl_hf/elche/")
    files = sorted((ROOT / "flodl_hf").rglob("*.py")) + sorted((ROOT / "heads").glob("*.py"))
    return [p for p in files if not str(p.relative_to(ROOT)).startswith(skip)]


def test_every_option_a_message_names_exists():
    known = _options(build_parser()) | _options(bench_parser()) | _options(simulate_parser()) | FOREIGN
    wrong = []
    for path in _modules():
        for line, value in _strings(path):
            if value.lstrip().startswith(("--", "-")) and len(value.split()) == 1:
                continue  # an add_argument flag itself
            wrong += [f"{path.relative_to(ROOT)}:{line}: {option}" for option in OPTION.findall(value)
                      if option not in known]
    assert not wrong, wrong


def test_the_cli_words_its_fixes_as_options_not_python_arguments():
    api = re.compile(r"\b(doc_stride|num_labels)\b|\b(labels|problem_type|max_length)=")
    found = [f"{path.relative_to(ROOT)}:{line}: {value[:80]}"
             for path in sorted((ROOT / "flodl_hf" / "cli").glob("*.py")) + sorted(
                 (ROOT / "flodl_hf" / "job").rglob("*.py"))
             if path.name != "settings.py"  # TrainSettings' own fields: the parser refuses a CLI value first
             for line, value in _raised(path) if api.search(value)]
    assert not found, found
