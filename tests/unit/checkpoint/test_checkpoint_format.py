"""The safe checkpoint format: nothing on a loading path unpickles, hostile files are refused without
running anything, the JSON/safetensors split round-trips exactly, and legacy or newer checkpoints are refused
clearly (or converted on request)."""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import pickle
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from flodl_hf import DdpConfig, Graph, Trainer, cli
from flodl_hf.builder.checkpoint import read_checkpoint, write_checkpoint
from flodl_hf.checkpoint.errors import CheckpointError, ResumeError
from flodl_hf.checkpoint.format import FORMAT_VERSION, _canonical, read_state, write_state
from flodl_hf.checkpoint.tree import decode, encode
from flodl_hf.cli.convert import convert_legacy
from flodl_hf.job.checkpoints import read_job_state

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "flodl_hf"
#: The one ``pickle.loads`` under flodl_hf/ and why it is not a checkpoint path: builder/data.py unpickles the
#: user's own dataset blob, which the same run pickled in memory moments before (never read from a file).
ALLOWED_UNPICKLE = {("flodl_hf/builder/data.py", "pickle.loads")}


def _graph(seed: int = 0) -> Graph:
    def build(dev=None):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 2))

    graph = Graph(build())
    Trainer.setup_with(graph, build, lambda p: torch.optim.AdamW(p, lr=1e-2), DdpConfig(verbose=False))
    graph.set_scheduler(torch.optim.lr_scheduler.LambdaLR(graph.optimizer, lambda s: 1.0 / (1 + s)))
    return graph


def _steps(graph: Graph, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        loss = graph.module(torch.randn(4, 6)).pow(2).mean()
        loss.backward()
        graph.step()
        losses.append(loss.item())
    return losses


# --- no unpickling on any loading path ------------------------------------------------------------------------

def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name):
            found.append((f"{node.func.value.id}.{node.func.attr}", node))
    return found


def test_no_loading_path_unpickles():
    """Grep and AST: no ``weights_only=False``, no ``pickle.load(s)`` / ``Unpickler`` but the one allowed (the user's
    in-memory dataset blob), and every ``torch.load`` passes ``weights_only=True``."""
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 40
    for path in files:
        rel = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"weights_only\s*=\s*False", text), rel
        for name, call in _calls(path):
            if name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load", "dill.loads"):
                assert (rel, name) in ALLOWED_UNPICKLE, (rel, name, call.lineno)
            if name == "torch.load":
                flags = {k.arg: k.value for k in call.keywords}
                assert isinstance(flags.get("weights_only"), ast.Constant) and flags["weights_only"].value is True, \
                    (rel, call.lineno)
    data = (PACKAGE / "builder" / "data.py").read_text(encoding="utf-8")
    assert data.count("pickle.loads(") == 1 and "self._blob" in data  # the exception stays exactly that


# --- hostile files --------------------------------------------------------------------------------------------

class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_a_malicious_legacy_pickle_is_refused_without_running(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    raw_dir, zip_dir = tmp_path / "raw", tmp_path / "zip"
    raw_dir.mkdir()
    zip_dir.mkdir()
    (raw_dir / "checkpoint.pt").write_bytes(pickle.dumps({"format": 1, "model": _Payload(marker)}, protocol=4))
    torch.save({"format": 1, "model": {}, "plan": {}, "x": _Payload(marker)}, zip_dir / "checkpoint.pt")
    assert not marker.exists()  # writing the payload runs nothing
    for directory in (raw_dir, zip_dir):
        with pytest.raises(ResumeError, match="legacy pickle checkpoint.*convert-checkpoint --trust-pickle"):
            _graph().load_checkpoint(directory)
        with pytest.raises(ResumeError, match="legacy pickle checkpoint"):
            read_job_state(str(directory))
        with pytest.raises(ResumeError, match="legacy pickle checkpoint"):
            read_checkpoint(directory / "checkpoint.pt")
        with pytest.raises(ValueError, match="--trust-pickle"):
            convert_legacy(directory)
        # even a user who says they trust it gets the restricted unpickler, which refuses exec
        with pytest.raises(ResumeError, match="refused"):
            convert_legacy(directory, trust_pickle=True)
        assert cli.main(["convert-checkpoint", "--trust-pickle", str(directory)]) == 2
        assert not marker.exists()
        assert sorted(p.name for p in directory.iterdir()) == ["checkpoint.pt"]  # nothing written
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("flodl-hf: error:") == 2


def _resign(manifest: Path, mutate) -> None:
    """Apply ``mutate`` to a manifest and give it a valid checksum again: a hostile file, not a damaged one."""
    record = json.loads(manifest.read_text())
    mutate(record)
    record["sha256"] = hashlib.sha256(_canonical(record)).hexdigest()
    manifest.write_text(json.dumps(record))


def _slot_digest(record: dict, slot: Path) -> None:
    data = slot.read_bytes()
    record["tensors"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("attack, needle", [
    ("path traversal", "names no valid tensors file"),
    ("object dtype", "NumPy dtype 'object'"),
    ("unknown tensor", "which its tensors file does not hold"),
    ("deep nesting", "nests"),
    ("hostile safetensors header", "is unreadable"),
    ("newer version", f"newer than this flodl-hf reads \\({FORMAT_VERSION}\\).*upgrade flodl-hf"),
    ("not ours", "not a flodl-hf checkpoint"),
])
def test_hostile_manifests_and_tensor_files_are_refused(tmp_path, attack, needle):
    graph = _graph()
    _steps(graph, 2)
    graph.save_checkpoint(tmp_path)
    manifest = tmp_path / "checkpoint.json"
    slot = tmp_path / "checkpoint.0.safetensors"
    if attack == "path traversal":
        (tmp_path / "evil.safetensors").write_bytes(slot.read_bytes())
        _resign(manifest, lambda r: r["tensors"].update(file="../" + tmp_path.name + "/evil.safetensors"))
    elif attack == "object dtype":
        _resign(manifest, lambda r: r["state"]["rng"][0]["numpy"]["__tuple__"][1].update(dtype="object"))
    elif attack == "unknown tensor":
        _resign(manifest, lambda r: r["state"]["model"]["0.weight"].update(__tensor__="../../etc/passwd"))
    elif attack == "deep nesting":
        text = '{"format": "flodl-hf-checkpoint", "version": 2, "state": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"
        manifest.write_text(text)
        needle = "unreadable|nests"
    elif attack == "hostile safetensors header":
        slot.write_bytes((2 ** 62).to_bytes(8, "little") + b"{" * 64)
        _resign(manifest, lambda r: _slot_digest(r, slot))
    elif attack == "newer version":
        _resign(manifest, lambda r: r.update(version=FORMAT_VERSION + 1))
    elif attack == "not ours":
        manifest.write_text(json.dumps({"format": "something-else", "__tensor__": "x"}))
    with pytest.raises(ResumeError, match=needle):
        _graph().load_checkpoint(tmp_path)


# --- exact round trip -----------------------------------------------------------------------------------------

def test_tree_round_trip_is_exact_and_keeps_types():
    shared = torch.randn(3, 4)
    tree = {
        "python": random.getstate(), "numpy": np.random.get_state(), "ints": {0: "a", 7: (1, 2.5)},
        "floats": [float("nan"), float("inf"), -0.0, 1e-310, 0.1 + 0.2], "bf16": torch.randn(5).bfloat16(),
        "tied": [shared, shared, shared[1]], "view": torch.arange(10)[::3], "tag": {"__tensor__": "not a tensor"},
        "empty": torch.zeros(0, 3), "nested": {"a": [None, True, {"b": (torch.ones(1),)}]},
    }
    json_tree, tensors = encode(tree)
    back = decode(json.loads(json.dumps(json_tree)), tensors, "test")
    random.setstate(back["python"])  # tuples came back as tuples
    np.random.set_state(back["numpy"])
    assert back["numpy"][1].dtype == np.uint32 and np.array_equal(back["numpy"][1], tree["numpy"][1])
    assert back["ints"] == {0: "a", 7: (1, 2.5)} and back["tag"] == {"__tensor__": "not a tensor"}
    assert str(back["floats"][0]) == "nan" and back["floats"][1:] == tree["floats"][1:]
    assert repr(back["floats"][2]) == "-0.0"
    assert torch.equal(back["bf16"], tree["bf16"]) and back["bf16"].dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(back["tied"], tree["tied"]))
    assert torch.equal(back["view"], torch.arange(10)[::3]) and back["empty"].shape == (0, 3)
    assert isinstance(back["nested"]["a"][2]["b"], tuple)
    with pytest.raises(CheckpointError, match="cannot store a value of type object at 'x/1'"):
        encode({"x": [1, object()]})


def test_optimizer_state_round_trips_exactly_through_the_files(tmp_path):
    graph = _graph()
    _steps(graph, 3)
    before = graph.optimizer.state_dict()
    write_state(tmp_path / "s.json", {"opt": before}, "setup")
    after = read_state(tmp_path / "s.json", "setup")["opt"]
    assert after["param_groups"] == before["param_groups"]
    assert after["state"].keys() == before["state"].keys()
    for k, state in before["state"].items():
        for name, value in state.items():
            assert torch.equal(after["state"][k][name], value) and after["state"][k][name].dtype == value.dtype


def test_resume_through_the_safe_format_reproduces_the_losses(tmp_path):
    torch.manual_seed(1)
    full = _steps(_graph(), 8)
    torch.manual_seed(1)
    graph = _graph()
    first = _steps(graph, 3)
    graph.save_checkpoint(tmp_path)
    torch.manual_seed(999)
    np.random.seed(5)
    resumed = _graph()
    resumed.load_checkpoint(tmp_path)
    assert first + _steps(resumed, 5) == full


# --- legacy conversion, the job plan without torch ------------------------------------------------------------

def test_a_trusted_legacy_checkpoint_converts_and_resumes(tmp_path, capsys):
    graph = _graph()
    _steps(graph, 2)
    graph.save_checkpoint(tmp_path / "new")
    state = read_state(tmp_path / "new" / "checkpoint.json")
    legacy = tmp_path / "old"
    legacy.mkdir()
    torch.save(dict(state, format=1), legacy / "checkpoint.pt")  # what flodl-hf before format 2 wrote
    assert cli.main(["convert-checkpoint", str(legacy)]) == 2
    assert "pass --trust-pickle" in capsys.readouterr().err
    assert cli.main(["convert-checkpoint", "--trust-pickle", str(legacy)]) == 0
    assert sorted(p.name for p in legacy.iterdir()) == ["checkpoint.0.safetensors", "checkpoint.json",
                                                       "checkpoint.pt"]  # the original is left as it was
    resumed = _graph(seed=3)
    resumed.load_checkpoint(legacy)
    assert resumed.training_step == 2
    for a, b in zip(resumed.module.parameters(), graph.module.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="already exists"):
        convert_legacy(legacy, trust_pickle=True)
    # builder: a legacy .pt next to which NAME.json is written
    torch.save({"format": "flodl-hf-builder/1", "model": {"w": torch.ones(2)}, "epoch": 0}, tmp_path / "e0.pt")
    assert convert_legacy(tmp_path / "e0.pt", trust_pickle=True) == tmp_path / "e0.json"
    assert torch.equal(read_checkpoint(tmp_path / "e0.json")["model"]["w"], torch.ones(2))
    with pytest.raises(ResumeError, match="legacy pickle checkpoint"):
        read_checkpoint(tmp_path / "e0.pt")


def test_builder_checkpoint_refuses_a_manifest_named_like_tensors(tmp_path):
    with pytest.raises(ValueError, match="names the checkpoint's JSON manifest"):
        write_checkpoint(tmp_path / "e.safetensors", {"w": torch.ones(1)})
