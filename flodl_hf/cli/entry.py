"""``main``: the entry point of ``flodl-hf`` and ``python -m flodl_hf``, and the mapping of errors to exit codes.

It exists so that every command reports the same way: 0 done; 2 for an error a user can cause (bad flags, missing
files, bad data, a checkpoint that does not fit), reported as one line on stderr, ``flodl-hf: error: ...``, never a
traceback; 1 when training diverged (NaN or infinite loss) or ``verify`` failed; 130 after Ctrl-C or SIGTERM
(``train`` first writes a checkpoint and prints the command that resumes it). ``bench`` hands its arguments to
``flodl_hf.bench.main``. :func:`console` is the program itself: ``main``, then an end that a Ctrl-C cannot turn
into a traceback or a success (the ranks' teardown and the interpreter's own run after ``main`` returns).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from ..job import interrupt
from .parser import PROG, UsageError, build_parser

__all__ = ["main", "console"]

#: The options that choose where each command writes (named by filesystem errors).
_WRITE_OPTIONS = {"train": "--output-dir or --checkpoint-dir", "eval": "--json FILE", "export": "--output",
                  "convert-checkpoint": "checkpoint directory"}
#: What a failed write leaves intact, by command: each writes to a temporary name and renames it into place.
_INTACT = {"eval": "--json FILE is as it was", "export": "--output is as it was",
           "convert-checkpoint": "the checkpoint directory is as it was"}


def _write_failure(exc: BaseException, argv: Sequence[str]) -> Optional[str]:
    """The one line for a write that failed (``exc``, or the OS error inside it), or None."""
    from ..preflight import TRAIN_INTACT, fs_error_message, os_error_of

    error = os_error_of(exc)
    command = argv[0] if argv else ""
    return None if error is None else fs_error_message(error, _WRITE_OPTIONS.get(command, "output path"),
                                                      _INTACT.get(command, TRAIN_INTACT))


def _run(command: str, args: object, argv: Sequence[str]) -> int:
    if command == "train":
        from .train import cmd_train

        return cmd_train(args, argv)  # type: ignore[arg-type]
    if command == "predict":
        from .predict import cmd_predict

        return cmd_predict(args)  # type: ignore[arg-type]
    if command == "eval":
        from .evaluate import cmd_eval

        return cmd_eval(args)  # type: ignore[arg-type]
    from .model_dirs import cmd_convert, cmd_export, cmd_verify

    commands = {"export": cmd_export, "verify": cmd_verify, "convert-checkpoint": cmd_convert}
    return commands[command](args)  # type: ignore[arg-type]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``flodl-hf`` and ``python -m flodl_hf``; returns the exit code."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    try:
        if argv[:1] == ["bench"]:  # every later argument belongs to the bench's own parser
            from ..bench import main as bench_main

            return int(bench_main(argv[1:]))
        args = build_parser().parse_args(argv)
        return _run(args.command, args, argv)
    except (UsageError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
            PermissionError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        if argv and argv[0] != "bench":  # the settings' own refusals speak Python; the command line names options
            from .spelling import command_spelling

            message = command_spelling(message, argv[0])
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an OSError, or a library's write error that holds one (safetensors)
        message = _write_failure(exc, argv)
        if message is None:
            raise
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2


def console(argv: Optional[Sequence[str]] = None) -> int:
    """The ``flodl-hf`` program (and ``python -m flodl_hf``): :func:`main`, then the end of the process, during
    which a Ctrl-C ends it at once in one line with exit code 130 (``flodl_hf.job.interrupt``). ``main`` alone is
    for callers that go on."""
    interrupt.run_as_program()
    try:
        return main(argv)
    finally:
        interrupt.work_done()
