"""Which batches the averaged model holds: the ledger behind exact epoch-end checkpoints.

Why it exists: epochs are pipelined (a rank that runs out of epoch ``e`` starts on ``e + 1``) and a checkpoint's
model is an average taken some time after epoch ``e``'s last batch was reported. For that checkpoint to mean
something, the coordinator must know which batches are in that average: it writes the checkpoint of epoch ``e`` only
once the average holds every batch of epochs up to ``e``, and lists the later epochs' batches it holds (``ahead``)
so that a resumed run skips them (``flodl_hf.builder.resume``) and every epoch after the checkpoint trains on each
batch exactly once.

How a batch moves: reported by its rank (each worker's reports precede its round or snapshot message on the same
queue), then part of that rank's round-``k`` message (collective backend) or snapshot (CPU backend), then in the log
as ``(round, epoch, batch)`` once round ``k`` closed. Batches of a snapshot that arrived after its round closed, and
of a worker that died before its next snapshot, are in no average and leave the ledger. Plain numbers only: the
coordinator feeds it and the tests drive it directly.
"""

from __future__ import annotations

__all__ = ["Ledger"]

Item = tuple[int, int]  # (epoch, batch index within the epoch)


class Ledger:
    """Tracks, for each batch reported, the averaging round that brought it into the model."""

    def __init__(self, world: int) -> None:
        self.since: list[list[Item]] = [[] for _ in range(world)]  # reported, in no round message yet
        self.rounds: dict[int, list[Item]] = {}  # collective: rounds not closed yet
        self.snaps: dict[tuple[int, int], list[Item]] = {}  # CPU backend: (rank, round) snapshots not averaged yet
        self.log: list[tuple[int, int, int]] = []  # (round, epoch, batch), rounds in closing order
        self.closed = -1  # the last round closed

    def reported(self, rank: int, item: Item) -> None:
        self.since[rank].append(item)

    def round_message(self, rank: int, k: int) -> None:
        """Collective backend: ``rank`` entered round ``k`` with every batch it reported before."""
        self.rounds.setdefault(k, []).extend(self.since[rank])
        self.since[rank] = []

    def close_collective(self, k: int) -> None:
        """Every rank's round-``k`` message is in: the round's average holds their batches."""
        self._close(k, self.rounds.pop(k, []))

    def snapshot(self, rank: int, k: int) -> None:
        """CPU backend: ``rank``'s snapshot for round ``k`` holds every batch it reported before."""
        self.snaps[(rank, k)], self.since[rank] = self.since[rank], []

    def close_snapshots(self, k: int, participants: list[int]) -> None:
        """CPU backend: round ``k`` closed with ``participants``' snapshots; earlier snapshots that missed their
        round are in no average."""
        items: list[Item] = []
        for key in sorted(q for q in self.snaps if q[1] <= k):
            got = self.snaps.pop(key)
            if key[1] == k and key[0] in participants:
                items.extend(got)
        self._close(k, items)

    def drop(self, rank: int) -> None:
        """``rank`` died: what it reported since its last snapshot is in no average."""
        self.since[rank] = []

    def _close(self, k: int, items: list[Item]) -> None:
        self.log.extend((k, e, b) for e, b in items)
        self.closed = max(self.closed, k)

    def holds_epoch(self, epoch: int, k: float) -> bool:
        """Does round ``k``'s average hold every reported batch of ``epoch`` and the epochs before it?"""
        pending = [*self.since, *self.rounds.values(), *self.snaps.values()]
        if any(e <= epoch for items in pending for e, _ in items):
            return False
        for rnd, e, _ in reversed(self.log):  # rounds close in order: only the log's tail is after round k
            if rnd <= k:
                return True
            if e <= epoch:
                return False
        return True

    def ahead(self, epoch: int, k: float) -> list[list[int]]:
        """The batches of epochs after ``epoch`` that round ``k``'s average holds, as ``[epoch, batch]`` pairs."""
        return sorted([e, b] for rnd, e, b in self.log if rnd <= k and e > epoch)
