"""Which minibatch each worker trains on at each step.

The training parts form one endless sequence: epoch e visits every part once, in an
order shuffled by (seed, e). A global cursor walks the sequence; at each step the active
workers, sorted by id, take the next ``len(active)`` positions. When workers leave or
join the cursor simply advances by a different amount, so the minibatches stay
re-striped over whoever is active and every part is still visited once per epoch.
"""

from __future__ import annotations

import numpy as np


class PartSequence:
    def __init__(self, num_parts: int, seed: int, shuffle: bool = True):
        if num_parts <= 0:
            raise ValueError("the dataset has no training parts")
        self.num_parts, self.seed, self.shuffle = num_parts, seed, shuffle
        self._orders: dict[int, np.ndarray] = {}  # the epochs in use (at most a couple)

    def _order(self, epoch: int) -> np.ndarray:
        order = self._orders.get(epoch)
        if order is None:
            if len(self._orders) >= 4:
                self._orders.pop(min(self._orders))
            order = (
                np.random.default_rng([self.seed, epoch]).permutation(self.num_parts)
                if self.shuffle
                else np.arange(self.num_parts)
            )
            self._orders[epoch] = order
        return order

    def part_at(self, position: int) -> int:
        """Index of the training part at a position of the sequence."""
        epoch, offset = divmod(position, self.num_parts)
        return int(self._order(epoch)[offset])

    def epoch_at(self, position: int) -> float:
        return position / self.num_parts


def position_of(cursor: int, members: list[int], worker: int) -> int:
    """Sequence position a worker trains on at a step whose first position is ``cursor``."""
    return cursor + sorted(members).index(worker)
