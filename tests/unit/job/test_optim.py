"""The command line's AdamW (``flodl_hf.job.optim.adamw``): fused where torch has the kernel, AdamW's update either way.

Checked against the reference: torch's own unfused AdamW with the same hyper-parameters, on a real (tiny) BERT.
"""

from __future__ import annotations

import copy

import torch
from transformers import BertConfig, BertForSequenceClassification

from flodl_hf.job.optim import adamw


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3,
                                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def test_cpu_parameters_get_the_fused_kernel_with_trainers_defaults():
    opt = adamw(_model().parameters(), 5e-5)
    assert opt.defaults["fused"] is True and opt.defaults["lr"] == 5e-5
    assert opt.defaults["weight_decay"] == 0.0 and opt.defaults["betas"] == (0.9, 0.999)  # Trainer's defaults


def test_fused_updates_equal_the_unfused_loop_to_float_rounding():
    fused_model = _model()
    plain_model = copy.deepcopy(fused_model)
    fused, plain = adamw(fused_model.parameters(), 1e-2), torch.optim.AdamW(plain_model.parameters(), lr=1e-2,
                                                                             weight_decay=0.0, foreach=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        ids = torch.randint(0, 50, (4, 7), generator=g)
        labels = torch.randint(0, 3, (4,), generator=g)
        for model, opt in ((fused_model, fused), (plain_model, plain)):
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    moved = 0
    for (name, a), b in zip(fused_model.named_parameters(), plain_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
        moved += int(not torch.equal(a, _model().state_dict()[name]))
    assert moved > 0


def test_parameters_without_a_fused_kernel_get_the_default_implementation():
    params = [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64, device="meta"))]
    opt = adamw(params, 1e-3)
    assert not opt.defaults.get("fused")
