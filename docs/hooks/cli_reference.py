"""MkDocs hook: fills docs/cli-reference.md with the ``--help`` of ``flodl-hf`` and of every subcommand.

It exists so that the command-line reference cannot drift from the command: the text is rendered at build time
from the real argparse parsers (``flodl_hf.cli.build_parser``, and ``flodl_hf.bench.cli.build_parser`` /
``flodl_hf.bench.simulate_cli.build_parser`` for ``bench``, which hands its arguments to a parser of its own), never
copied by hand. The page holds one marker, ``<!-- cli-reference -->``, replaced by one section per command; a page
without it, or a subcommand without a parser, fails the build instead of publishing a stale page.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

MARKER = "<!-- cli-reference -->"
PAGE = "cli-reference.md"
#: The width the help text is wrapped at (argparse reads $COLUMNS), so that the page does not depend on a terminal.
WIDTH = 100
ROOT = Path(__file__).resolve().parents[2]
#: Subcommands that hand every argument to a parser of their own (``add_help=False`` in the main parser):
#: the modules whose ``build_parser()`` is their reference, each with the words that select it.
DELEGATED = {"bench": (("flodl_hf.bench.cli", "flodl-hf bench"),
                       ("flodl_hf.bench.simulate_cli", "flodl-hf bench --simulate"))}


@contextmanager
def _columns(width: int) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def _import(name: str):
    """This checkout's module (the repository root first on sys.path, ahead of any installed copy)."""
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if len(actions) != 1:
        raise RuntimeError(f"{parser.prog}: expected one set of subcommands, found {len(actions)}")
    return dict(actions[0].choices)


def parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """``(command line, parser)`` for ``flodl-hf`` and each subcommand, in the parser's order."""
    main = _import("flodl_hf.cli").build_parser()
    found = [(main.prog, main)]
    for name, sub in _subcommands(main).items():
        if sub.add_help:
            found.append((sub.prog, sub))
            continue
        if name not in DELEGATED:
            raise RuntimeError(f"`{main.prog} {name}` has no --help of its own and no parser is known for it: "
                               "add it to DELEGATED in docs/hooks/cli_reference.py")
        found += [(title, _import(module).build_parser()) for module, title in DELEGATED[name]]
    return found


def render() -> str:
    """The reference as Markdown: one heading and one ``text`` block of ``--help`` output per command."""
    sections = []
    with _columns(WIDTH):
        for title, parser in parsers():
            sections.append(f"## `{title}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(sections)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    if page.file.src_uri != PAGE:
        return markdown
    if markdown.count(MARKER) != 1:
        raise RuntimeError(f"docs/{PAGE} must hold the marker {MARKER} exactly once")
    return markdown.replace(MARKER, render())
