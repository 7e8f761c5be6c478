"""Which instances each rank reads at each step: a pure function of (seed, step, rank).

Every epoch is a seeded permutation of the instances; optimizer step ``s`` takes the ``s``-th
global batch of it, and rank ``r`` takes its own contiguous share of that batch, split into its
micro-batches. The permutation is never materialized: position ``i`` of epoch ``e`` maps to
instance ``σ_e(i)``, a keyed bijection of ``[0, N)`` (a 6-round Feistel network over the smallest
even number of bits that holds ``N``, its round keys drawn from ``(seed, e)``, cycle-walked back into
``[0, N)``), evaluated for just the positions a step needs. So a rank (and each of its loader's
workers) reads its share with constant memory and start-up whatever the dataset's size, where the
``numpy`` permutation of 100M instances this replaced took 7-10 s and 381 MiB (twice that while
made) in every worker, at every epoch (benchmarks/bench_loader.py). Because the position in the
data stream *is* the step number, resuming at step ``s`` starts reading exactly there, with
nothing re-read and nothing skipped through, and no two ranks ever read the same instance in a
step. An incomplete last global batch of an epoch is dropped (the next epoch reshuffles everything).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from biomed_lm.pretrain.config import PretrainConfigError


@dataclass
class BatchPlan:
    num_instances: int
    micro_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    rank: int
    seed: int
    _keys_epoch: int = field(default=-1, init=False, repr=False)
    _keys: np.ndarray | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world size {self.world_size}")
        if self.steps_per_epoch < 1:
            raise PretrainConfigError(f"{self.num_instances} instances cannot fill one global batch of "
                                      f"{self.global_batch_size}; make more data or a smaller batch")

    @property
    def per_rank(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps

    @property
    def global_batch_size(self) -> int:
        return self.per_rank * self.world_size

    @property
    def steps_per_epoch(self) -> int:
        return self.num_instances // self.global_batch_size

    def shuffled(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Positions ``start``..``stop``-1 of epoch ``epoch``'s permutation (int64 instance indices)."""
        if epoch != self._keys_epoch:
            self._keys = np.random.SeedSequence([self.seed, epoch]).generate_state(_ROUNDS, dtype=np.uint64)
            self._keys_epoch = epoch
        return _permute(np.arange(start, stop, dtype=np.uint64), self.num_instances, self._keys).astype(np.int64)

    def permutation(self, epoch: int) -> np.ndarray:
        """The whole permutation of epoch ``epoch`` (tests and benchmarks; the loader never builds it)."""
        return self.shuffled(epoch, 0, self.num_instances)

    def micro_batches(self, step: int) -> list[list[int]]:
        """The instance indices of this rank's micro-batches for optimizer step ``step`` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.global_batch_size + self.rank * self.per_rank
        mine = self.shuffled(epoch, start, start + self.per_rank)
        return [mine[i:i + self.micro_batch_size].tolist() for i in range(0, self.per_rank, self.micro_batch_size)]


#: The order's name, in every run's signature (pretrain.resume): a checkpoint written under another
#: order (``permutation``: numpy's, before 2026-11-26) would resume mid-epoch reading other instances,
#: re-reading some and skipping others, so resuming it is a reported change.
SAMPLE_ORDER = "feistel-v1"
_ROUNDS = 6
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _round(half: np.ndarray, key: np.uint64, mask: np.uint64) -> np.ndarray:
    """The Feistel round function: splitmix64's finalizer of ``half`` ^ ``key``, cut to the half's bits."""
    x = half ^ key
    x ^= x >> np.uint64(30)
    x *= _MIX[0]
    x ^= x >> np.uint64(27)
    x *= _MIX[1]
    x ^= x >> np.uint64(31)
    return x & mask


def _permute(positions: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """``σ(positions)`` for the keyed bijection σ of ``[0, n)``: a balanced Feistel network on
    ``2 * half`` bits (a bijection of ``[0, 4 ** half)``), re-applied to the values that land at or
    above ``n`` until none does (cycle walking: the result stays a bijection of ``[0, n)``)."""
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    shift, mask, limit = np.uint64(half), np.uint64((1 << half) - 1), np.uint64(n)

    def encrypt(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for key in keys:
            left, right = right, left ^ _round(right, key, mask)
        return (left << shift) | right

    out = encrypt(positions)
    outside = out >= limit
    while outside.any():
        out[outside] = encrypt(out[outside])
        outside = out >= limit
    return out
