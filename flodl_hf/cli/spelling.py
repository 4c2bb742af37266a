"""The command line's spelling of an error: ``--devices cuda:0,cpu`` where the Python API says ``devices=[...]``.

Why it exists: the settings the command line fills in (``TrainSettings``, ``DdpConfig``) are also the Python API,
and their one validator per concept words its refusals as a Python user writes them: ``DdpConfig.devices=[...]``,
``lr_scheduler_type='cosinus'``. A command-line user typed ``--devices`` and ``--lr-scheduler-type``, so every
error ``flodl-hf`` prints is respelled here, once, at the boundary: a field the command has an option for becomes
that option, and its value is written as the option takes it (a list comma-joined, a speed hint ``RANK:RATIO``, a
string unquoted). Fields with no option of the command are left as they are (the command line cannot reach them).
"""

from __future__ import annotations

import argparse
import ast
import re
from typing import Any

__all__ = ["cli_spelling", "command_spelling", "field_options"]

#: A value as Python prints it: a quoted string, a list, a tuple, or a bare word / number.
_VALUE = r"('[^']*'|\"[^\"]*\"|\[[^\]]*\]|\([^)]*\)|[-+\w.:]+)"
#: ``DdpConfig.name=value``, ``TrainSettings.name=value``, ``name=value`` (not an option's ``--name=value``), or the
#: validators' ``devices [...]`` (a list named without ``=``).
_ASSIGNED = re.compile(r"(?<![-\w.])(?:(?:DdpConfig|TrainSettings)\.)?([a-z][a-z0-9_]*)=" + _VALUE)
_NAMED_LIST = re.compile(r"(?<![-\w.])(devices) (\[[^\]]*\])")
_QUALIFIED = re.compile(r"(?<![-\w.])(?:DdpConfig|TrainSettings)\.([a-z][a-z0-9_]*)\b")
#: ``label_column / --label-column``: the Python name beside the option, where one message serves both surfaces.
_BOTH = re.compile(r"(?<![-\w.])([a-z][a-z0-9_]*) / (--[a-z0-9-]+)")


def field_options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each setting a command's parser fills in (an action's ``dest``) and the option that sets it."""
    out = {}
    for action in parser._actions:  # argparse keeps a parser's actions here; there is no public accessor
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest not in out:
            out[action.dest] = longs[0]
    return out


def _as_typed(field: str, text: str) -> str:
    """A Python-printed value as the command line takes it."""
    try:
        value: Any = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    if isinstance(value, str):
        return value
    if isinstance(value, tuple):
        return ":".join(str(v) for v in value) if field == "speed_hint" else ",".join(str(v) for v in value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def cli_spelling(message: str, options: dict[str, str]) -> str:
    """``message`` with every field that has an option in ``options`` (``field_options``) spelled as that option."""

    def assigned(match: re.Match) -> str:
        field, value = match.group(1), match.group(2)
        option = options.get(field)
        return match.group(0) if option is None else f"{option} {_as_typed(field, value)}"

    def qualified(match: re.Match) -> str:
        option = options.get(match.group(1))
        return match.group(0) if option is None else option

    def both(match: re.Match) -> str:
        return match.group(2) if options.get(match.group(1)) == match.group(2) else match.group(0)

    message = _BOTH.sub(both, message)
    message = _ASSIGNED.sub(assigned, message)
    message = _NAMED_LIST.sub(assigned, message)
    return _QUALIFIED.sub(qualified, message)


def command_spelling(message: str, command: str) -> str:
    """``message`` as ``flodl-hf COMMAND`` spells it (unchanged for a command without a parser of its own here)."""
    from .parser import build_parser

    sub = next((a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)), None)
    parser = None if sub is None else sub.choices.get(command)
    return message if parser is None else cli_spelling(message, field_options(parser))
