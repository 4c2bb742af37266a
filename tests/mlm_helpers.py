"""Tiny helpers for the masked-LM head tests: seeded texts, dropout-free heads, a toy corpus.

It exists so that the masked-LM test modules share these without touching ``tiny_models`` (which other test
modules own). Nothing here imports flodl_hf on import beyond ``heads.masked_lm``.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tiny_models import TOY_WORDS, tiny_config, tiny_tokenizer, toy_task

from heads.masked_lm import AutoHeadForMaskedLM, MaskedLMHead

__all__ = ["random_texts", "toy_corpus", "fresh_head", "no_dropout_config", "mask_token", "step"]


def random_texts(n: int, seed: int, min_words: int = 1, max_words: int = 12) -> list[str]:
    """``n`` texts of ``min_words..max_words`` words drawn from ``TOY_WORDS`` (seeded)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(TOY_WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(n)]


def toy_corpus(n: int, seed: int) -> list[str]:
    """``n`` sentences with toy_task's fixed structure (subject, verb, intensifier, adjective, tail)."""
    return [text for text, _ in toy_task(n, seed=seed)]


def no_dropout_config(family: str):
    """``tiny_config(family)`` without dropout (so that train and eval mode compute the same loss)."""
    config = tiny_config(family)
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout",
                 "classifier_dropout_prob"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    return config


def fresh_head(family: str, seed: int = 0, **kwargs) -> MaskedLMHead:
    """A from_config head of ``family`` (seeded weights, no dropout) with the tiny tokenizer."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = AutoHeadForMaskedLM.from_config(no_dropout_config(family), tokenizer=tiny_tokenizer(family), **kwargs)
    return head


def mask_token(family: str) -> str:
    return tiny_tokenizer(family).mask_token


def step(head: MaskedLMHead, texts: list[str], lr: float = 0.5) -> None:
    """One plain SGD step on ``texts`` (moves every weight away from its initial value)."""
    params = list(head.graph().module.parameters())
    loss = head.compute_loss(*head.collate(texts))
    loss.backward()
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= lr * p.grad
                p.grad = None


def checkpoint_keys(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))
