"""Which instances each rank reads at each step: a pure function of (seed, step, rank).

Every epoch is a seeded permutation of the instances; optimizer step ``s`` takes the ``s``-th
global batch of it, and rank ``r`` takes its own contiguous share of that batch, split into its
micro-batches. Because the position in the data stream *is* the step number, resuming at step
``s`` starts reading exactly there, with nothing re-read and nothing skipped through, and no
two ranks ever read the same instance in a step. An incomplete last global batch of an epoch is
dropped (the next epoch reshuffles everything).
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
    _permutation_epoch: int = field(default=-1, init=False, repr=False)
    _permutation: np.ndarray | None = field(default=None, init=False, repr=False)

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

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._permutation_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            dtype = np.int32 if self.num_instances < 2 ** 31 else np.int64
            self._permutation = rng.permutation(self.num_instances).astype(dtype, copy=False)
            self._permutation_epoch = epoch
        return self._permutation  # type: ignore[return-value]

    def micro_batches(self, step: int) -> list[list[int]]:
        """The instance indices of this rank's micro-batches for optimizer step ``step`` (0-based)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.global_batch_size + self.rank * self.per_rank
        mine = self.permutation(epoch)[start:start + self.per_rank]
        return [mine[i:i + self.micro_batch_size].tolist() for i in range(0, self.per_rank, self.micro_batch_size)]
