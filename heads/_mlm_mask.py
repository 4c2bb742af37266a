"""Seeded, rank-independent masking of token ids for masked-LM training (BERT's 80/10/10 rule).

It exists because a masked-LM collate draws random numbers, and a random stream shared by a process would make
the masks depend on which texts that process collated before (so on the number of ranks, the batch order and any
read-ahead). Here each text's mask is drawn from its own generator, seeded by a hash of ``(seed, epoch, the
text's token ids)``: the same text gets the same mask in a given epoch whichever rank, batch or padding it lands
in, so N-rank training sees exactly the masks of a one-process run, and a run is reproducible from ``seed``.

The rule is transformers' ``DataCollatorForLanguageModeling``'s (not its random stream): every maskable token
(not padding, not a special token such as ``[CLS]``, ``[SEP]``, ``[MASK]`` or ``[UNK]``) is selected with
probability ``probability``; a selected token becomes the mask token (80 %), a random token id (10 %) or stays
unchanged (10 %); the labels are the original ids at selected positions and ``-100`` elsewhere. A text with at
least one maskable token where no token was selected gets its token with the smallest draw selected, so that no
text (and so no batch) has an undefined, NaN loss; this raises the selection rate of very short texts only
(a 3-token text at 0.15 is forced 61 % of the time, a 30-token text 0.8 %).
"""

from __future__ import annotations

import hashlib
import struct

import torch

__all__ = ["MASK_FRACTION", "RANDOM_FRACTION", "IGNORE_INDEX", "text_seed", "mask_tokens", "check_probability"]

MASK_FRACTION = 0.8
"""Share of the selected tokens replaced by the mask token."""
RANDOM_FRACTION = 0.1
"""Share of the selected tokens replaced by a random token id (the remaining 10 % stay unchanged)."""
IGNORE_INDEX = -100
"""Label of a token that is not predicted (transformers' ``ignore_index``)."""


def check_probability(probability: object) -> float:
    """``probability`` if it is a number in (0, 1], else ValueError naming it."""
    if isinstance(probability, bool) or not isinstance(probability, (int, float)) or not 0 < probability <= 1:
        raise ValueError(
            f"mlm_probability={probability!r} is invalid: use a number in (0, 1], e.g. 0.15 (BERT's rate)"
        )
    return float(probability)


def text_seed(seed: int, epoch: int, token_ids: torch.Tensor) -> int:
    """A 63-bit generator seed from ``(seed, epoch, token ids)``: blake2b of their little-endian int64 bytes."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(struct.pack("<qq", int(seed), int(epoch)))
    digest.update(token_ids.to(torch.int64).contiguous().numpy().tobytes())
    return int.from_bytes(digest.digest(), "little") & ((1 << 63) - 1)


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    special: torch.Tensor,
    *,
    probability: float,
    mask_id: int,
    vocab_size: int,
    seed: int,
    epoch: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(masked_ids, labels)`` of a CPU batch ``input_ids`` ``[B, T]``.

    ``special`` ``[B, T]`` (bool) marks tokens that are never selected; padding (``attention_mask == 0``) is never
    selected either. Each row's draws come from its own generator seeded by :func:`text_seed` over the row's real
    tokens (``attention_mask == 1``, in order), so neither the padding side nor the padded length changes a mask.
    Random replacements are ids in ``[0, vocab_size)``.
    """
    masked = input_ids.clone()
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    real = attention_mask.bool()
    maskable = real & ~special.bool()
    for row in range(input_ids.shape[0]):
        positions = maskable[row].nonzero().squeeze(1)
        n = int(positions.numel())
        if n == 0:
            continue
        generator = torch.Generator().manual_seed(text_seed(seed, epoch, input_ids[row][real[row]]))
        select_draw = torch.rand(n, generator=generator)
        action_draw = torch.rand(n, generator=generator)
        random_ids = torch.randint(vocab_size, (n,), generator=generator, dtype=input_ids.dtype)
        selected = select_draw < probability
        if not bool(selected.any()):
            selected[int(torch.argmin(select_draw))] = True  # never a row without a target (see the module doc)
        chosen = positions[selected]
        labels[row, chosen] = input_ids[row, chosen]
        action = action_draw[selected]
        to_mask = action < MASK_FRACTION
        to_random = (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
        masked[row, chosen[to_mask]] = mask_id
        masked[row, chosen[to_random]] = random_ids[selected][to_random]
    return masked, labels
