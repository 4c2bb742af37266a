"""The builder's data path and the settings around it: the dataset packed once into plain-pickle bytes (no
file descriptor per tensor in the caller), the default collate on raw ``datasets.Dataset`` rows, the error a
failed start gives, the new settings (progressive_dispatch, max_overshoot, timeline) and the defaults; then
real 2-worker runs (fd count in the caller, a ``datasets.Dataset``) and the shipped example under
``ulimit -n 1024``.
"""

from __future__ import annotations

import errno
import functools
import os
import pickle
import shlex
import subprocess
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import datasets
import pytest
import builder_toy as toy
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's shared-memory reductions on ForkingPickler
from transformers import AutoTokenizer, BertConfig

from flodl_hf import ApplyPolicy, AverageBackend, Trainer
from flodl_hf.builder.data import PackedDataset, collate, pack_dataset
from flodl_hf.builder.lifecycle import start_error
from flodl_hf.builder.settings import DEFAULT_DIVERGENCE_THRESHOLD, BuilderSettings
from flodl_hf.builder.step import Recipe
from flodl_hf.defaults import default_model_path
from warm_python import python_command

ROOT = Path(__file__).resolve().parents[3]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rows(n: int, width: int = 48) -> list[dict]:
    """Per-item rows sliced from one tokenizer-like tensor, as ``enc["input_ids"][i]`` gives them."""
    ids = torch.arange(n * width).reshape(n, width)
    mask = ids % 2
    return [{"input_ids": ids[i], "attention_mask": mask[i], "labels": torch.tensor(i % 2)} for i in range(n)]


# -------------------------------------------------------------------------------------------------- packing
def test_pack_is_one_compact_blob_with_len_and_lazy_items():
    rows = _rows(1500)
    packed = pack_dataset(rows)
    assert len(packed) == 1500 and packed.nbytes > 0  # len() without unpickling
    # each row carries its own 48 tokens, not the whole 1500 x 48 storage it was sliced from
    assert packed.nbytes < 3 * 1500 * 48 * 8
    clone = pickle.loads(pickle.dumps(packed))
    assert isinstance(clone, PackedDataset) and len(clone) == 1500 and clone.nbytes == packed.nbytes
    assert torch.equal(clone[7]["input_ids"], rows[7]["input_ids"]) and clone.nbytes == 0  # unpickled once
    assert clone[1499]["labels"].item() == 1 and clone.unwrap() is clone.unwrap()
    assert pack_dataset(packed) is packed
    assert len(pickle.loads(pickle.dumps(clone))) == 1500  # re-pickling an unpacked one still works


def test_tensors_round_trip_exactly():
    base = torch.randn(6, 5)
    ds = [
        base[:, 1],  # non-contiguous view
        torch.tensor(3),  # 0-dim
        torch.empty(0, 4),
        torch.randn(3, dtype=torch.bfloat16),
        torch.randn(2, 2, requires_grad=True),
        torch.tensor([True, False]),
    ]
    out = pickle.loads(pickle.dumps(pack_dataset(ds))).unwrap()
    for a, b in zip(ds, out):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
        assert torch.equal(a.detach(), b.detach())
    out[0][0] = 99.0  # a private, writable copy
    assert base[0, 1] != 99.0


def test_sending_a_packed_dataset_to_a_process_opens_no_file_descriptors():
    rows = _rows(300)
    packed = pack_dataset(rows)
    before = _fds()
    ForkingPickler.dumps(packed)  # what process start does with the worker's args
    assert _fds() - before <= 2
    ForkingPickler.dumps(rows)  # the raw dataset: every storage moved to shared memory, one fd each
    assert _fds() - before > 250


def test_unpicklable_dataset_is_a_clear_error():
    class Holder(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.fn = lambda i: i

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            return self.fn(i)

    with pytest.raises(ValueError) as info:
        pack_dataset(Holder())
    text = str(info.value)
    assert "Holder" in text and "cannot be pickled" in text and "__getitem__" in text


def test_hf_datasets_pack_in_memory_and_by_file_path(tmp_path):
    ids = [[i, i + 1, i + 2] for i in range(200)]
    ds = datasets.Dataset.from_dict({"input_ids": ids, "label": [0, 1] * 100})
    clone = pickle.loads(pickle.dumps(pack_dataset(ds)))
    assert len(clone) == 200 and clone[5] == ds[5]
    ds.save_to_disk(str(tmp_path / "ds"))
    on_disk = datasets.load_from_disk(str(tmp_path / "ds"))
    packed = pack_dataset(on_disk)
    clone = pickle.loads(pickle.dumps(packed))
    assert len(clone) == 200 and clone[199] == ds[199]
    assert packed.nbytes < pack_dataset(ds).nbytes * 4  # a memory map by path, not a copy of every row


# -------------------------------------------------------------------------------------------------- collate
@pytest.fixture(scope="module")
def tokenized() -> datasets.Dataset:
    tok = AutoTokenizer.from_pretrained(str(default_model_path()))
    texts = ["a fine film", "dull and long", "loved it", "not for me", "great cast", "meh"]
    enc = tok(texts, padding="max_length", truncation=True, max_length=12)
    return datasets.Dataset.from_dict({**enc, "text": texts, "label": [1, 0, 1, 0, 1, 0], "score": [0.5] * 6})


def test_collate_stacks_raw_hf_rows_into_tensors(tokenized):
    batch = collate([tokenized[i] for i in range(4)])
    assert batch["input_ids"].shape == (4, 12) and batch["input_ids"].dtype == torch.int64
    assert batch["attention_mask"].shape == (4, 12)
    assert batch["label"].tolist() == [1, 0, 1, 0]
    assert batch["text"] == ["a fine film", "dull and long", "loved it", "not for me"]
    floats = collate([{"v": [0.5, 1]}, {"v": [2, 3.5]}])["v"]
    assert floats.dtype == torch.float32 and floats.tolist() == [[0.5, 1.0], [2.0, 3.5]]
    nested = collate([{"enc": {"ids": [1, 2]}, "y": 0}, {"enc": {"ids": [3, 4]}, "y": 1}])
    assert nested["enc"]["ids"].tolist() == [[1, 2], [3, 4]]


def test_collate_refuses_ragged_lists_naming_the_column_and_the_fix():
    rows = [{"input_ids": [1, 2, 3], "label": 0}, {"input_ids": [4, 5], "label": 1}]
    with pytest.raises(ValueError) as info:
        collate(rows)
    text = str(info.value)
    assert "'input_ids'" in text and "[2, 3]" in text
    assert "padding='max_length'" in text and "DataCollatorWithPadding" in text


def test_collate_delegates_everything_else_to_torch():
    items = [(torch.ones(2), 1), (torch.zeros(2), 0)]
    ours, theirs = collate(items), torch.utils.data.default_collate(items)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    tensors = collate([{"x": torch.ones(3), "y": 2}, {"x": torch.zeros(3), "y": 3}])
    assert tensors["x"].shape == (2, 3) and tensors["y"].tolist() == [2, 3]


# --------------------------------------------------------------------------------------------- start errors
def _recipe(**kw) -> Recipe:
    base = dict(model_factory=toy.tiny_mlp, optim_factory=toy.sgd, train_fn=toy.train_fn,
                dataset=pack_dataset(toy.ToyPoints(32)), batch_size=4)
    base.update(kw)
    return Recipe(**base)


def test_start_error_names_the_fd_limit():
    text = start_error(OSError(errno.EMFILE, "Too many open files"), _recipe())
    assert "file descriptors" in text and "ulimit -n" in text and "lambda" not in text
    shm = RuntimeError("unable to open shared memory object </torch_1>: Too many open files")
    assert "ulimit -n" in start_error(shm, _recipe())


def test_start_error_names_the_unpicklable_object():
    text = start_error(pickle.PicklingError("x"), _recipe(train_fn=lambda m, b: b))
    assert "train_fn=" in text and "lambda" in text
    plain = start_error(RuntimeError("no more processes"), _recipe())
    assert "no more processes" in plain and "lambda" not in plain


# ------------------------------------------------------------------------------------------------- settings
def _settings(**kw) -> BuilderSettings:
    s = BuilderSettings(model_factory=toy.tiny_mlp, optim_factory=toy.sgd, train_fn=toy.train_fn,
                        dataset=toy.ToyPoints(1600), batch_size=16, num_epochs=1, devices=["cpu"])
    for k, v in kw.items():
        setattr(s, k, v)
    s.validate()
    return s


def test_defaults_match_the_original_or_say_why():
    s = BuilderSettings()
    assert s.divergence_threshold == DEFAULT_DIVERGENCE_THRESHOLD == 0.05
    assert s.lr_scale_ratio == 0.0 and s.progressive_dispatch is None and s.max_overshoot is None
    assert s.timeline is False


def test_progressive_dispatch_resolves_per_policy():
    assert _settings().resolved_progressive() is True
    assert _settings(policy=ApplyPolicy.ASYNC).resolved_progressive() is True
    assert _settings(policy=ApplyPolicy.SYNC).resolved_progressive() is False
    assert _settings(progressive_dispatch=False).resolved_progressive() is False


@pytest.mark.parametrize(
    "rows, epochs, start, ceiling",
    # total batches: 100, 400, 10000, 10
    [(1600, 1, 2, 3), (1600, 4, 4, 8), (16000, 10, 5, 10), (160, 1, 2, 3)],
)
def test_max_overshoot_auto_start_and_ceiling(rows, epochs, start, ceiling):
    s = _settings(dataset=toy.ToyPoints(rows), num_epochs=epochs, backend=AverageBackend.CPU)
    assert s.resolved_max_overshoot() == start and s.max_overshoot_ceiling() == ceiling


def test_max_overshoot_given_and_where_it_does_not_apply():
    cpu = functools.partial(_settings, backend=AverageBackend.CPU)
    assert cpu(max_overshoot=7).resolved_max_overshoot() == 7
    assert cpu(max_overshoot=7).max_overshoot_ceiling() == 7  # above the auto ceiling: no growth
    assert cpu(max_overshoot=1, num_epochs=20).max_overshoot_ceiling() == 10
    assert cpu(max_overshoot=40).max_overshoot_ceiling() == 40
    assert _settings().resolved_max_overshoot() is None  # NCCL: every average holds every rank
    assert cpu(policy=ApplyPolicy.SYNC).resolved_max_overshoot() is None
    assert cpu(progressive_dispatch=False).resolved_max_overshoot() is None


def test_new_settings_are_validated_together():
    b = (Trainer.builder(toy.tiny_mlp, toy.sgd, toy.train_fn).dataset(toy.ToyPoints(64)).batch_size(16)
         .num_epochs(1).devices(["cpu"]).policy(ApplyPolicy.SYNC).progressive_dispatch(True).max_overshoot(3)
         .timeline("yes"))
    with pytest.raises(ValueError) as info:
        b.run()
    text = str(info.value)
    assert "progressive_dispatch=True" in text and "equally up front" in text
    assert "max_overshoot=3" in text and "SYNC" in text
    assert "timeline='yes'" in text
    for bad_n in (0, 2.5, True):
        with pytest.raises(ValueError, match="integer >= 1"):
            _settings(backend=AverageBackend.CPU, max_overshoot=bad_n)
    with pytest.raises(ValueError, match="NCCL backend"):
        _settings(max_overshoot=3)
    with pytest.raises(ValueError, match="turned off"):
        _settings(backend=AverageBackend.CPU, max_overshoot=3, progressive_dispatch=False)
    with pytest.raises(ValueError, match="True or False"):
        _settings(progressive_dispatch="on")
    ok = Trainer.builder(toy.tiny_mlp, toy.sgd, toy.train_fn).timeline().max_overshoot(3)
    ok = ok.progressive_dispatch(True)
    assert ok._s.timeline is True and ok._s.max_overshoot == 3 and ok._s.progressive_dispatch is True


def test_a_task_head_factory_is_accepted():
    from heads import BertForSequenceClassification

    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=16)
    factory = functools.partial(BertForSequenceClassification.on_device, config, 2)
    assert _settings(model_factory=factory, devices=["cpu", "cpu"]).validate() == ["cpu", "cpu"]


# ------------------------------------------------------------------------------------------------ real runs
def _tiny(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 2).to(device)


def _train(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])


def _bag(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.EmbeddingBag(64, 2).to(device)


def _train_bag(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(batch["input_ids"]), batch["label"])


def _run(builder) -> list:
    handle = builder.devices(["cpu", "cpu"]).progress(False).start_method("forkserver").timeout(30).run()
    metrics = []
    while (m := handle.next_metrics()) is not None:
        metrics.append(m)
    handle.join()
    return metrics


@pytest.mark.timeout(240)
def test_two_worker_run_keeps_the_callers_fds_flat():
    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(8, generator=g), "y": torch.tensor(i % 2)} for i in range(5000)]
    before = _fds()
    handle = (Trainer.builder(_tiny, toy.sgd, _train).dataset(rows).batch_size(50).num_epochs(1)
              .devices(["cpu", "cpu"]).progress(False).start_method("forkserver").timeout(30).run())
    during = _fds()
    metrics = []
    while (m := handle.next_metrics()) is not None:
        metrics.append(m)
    handle.join()
    # before packing, every one of the 10,000 tensors cost the caller one fd (measured: 6 -> 10,019)
    assert during - before < 100, (before, during)
    assert len(metrics) == 1 and sum(metrics[0].per_rank_batch_share) == pytest.approx(1.0)
    assert not rows[0]["x"].is_shared()  # the user's data is untouched (not moved to shared memory)


@pytest.mark.timeout(240)
def test_two_worker_run_on_a_raw_hf_dataset():
    ds = datasets.Dataset.from_dict(
        {"input_ids": [[i % 64, (3 * i) % 64, 5] for i in range(128)], "label": [i % 2 for i in range(128)]}
    )
    metrics = _run(Trainer.builder(_bag, toy.sgd, _train_bag).dataset(ds).collate_fn(collate).batch_size(16)
                   .num_epochs(2))
    assert [m.epoch for m in metrics] == [0, 1]
    assert all(m.avg_loss == m.avg_loss for m in metrics)  # finite numbers came back


@pytest.mark.timeout(300)
def test_example_runs_under_ulimit_1024():
    python = shlex.join(python_command())  # the warm interpreter keeps its caller's descriptor limit
    cmd = f"ulimit -n 1024 && {python} examples/builder_mode.py --rows 1500 --epochs 1"
    proc = subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 0: loss" in proc.stdout and "averaged over 2 workers" in proc.stdout
