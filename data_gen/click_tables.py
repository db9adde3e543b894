"""Seeded clicks over three kinds of categorical input, one table each: the data of notebook 06.

Every sample has

- ``items``: a multi-hot history of `items_per_sample` keys, Zipf-skewed over
  `item_vocabulary` keys, shape ``[n, 1, items_per_sample]`` (one slot);
- ``fields``: one key in each of ``len(field_sizes)`` one-hot fields of very different sizes,
  shape ``[n, fields, 1]``; field ``f`` has its own key range starting at the sum of the sizes
  before it (the offsets a loader's key offsets give), so the fields can share one table;
- ``weekday``: one of 7 keys, shape ``[n, 1]``.

The label follows a planted logistic model (a weight per key, summed over the sample), so a
model's loss can go down; the same seed gives the same batches, in the same order.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernels import checks


class ClickSamples:
    """Draws batches of the three inputs and their planted labels.

    Args:
        item_vocabulary: keys of the multi-hot ``items`` input.
        field_sizes: keys of each one-hot field.
        seed: the planted weights and every batch drawn after them.
        items_per_sample: keys of each sample's ``items`` history.

    Example:
        >>> samples = ClickSamples(1000, [50, 20], seed=0)
        >>> features, labels = samples.batch(4)
        >>> {k: v.shape for k, v in features.items()}, labels.shape
        ({'items': (4, 1, 3), 'fields': (4, 2, 1), 'weekday': (4, 1)}, (4, 1))
        >>> bool((features["fields"][:, 1] >= 50).all())  # field 1's keys come after field 0's
        True
    """

    WEEKDAYS = 7

    def __init__(self, item_vocabulary: int, field_sizes: Sequence[int], seed: int = 0, items_per_sample: int = 3):
        self.item_vocabulary = checks.positive_int("item_vocabulary", item_vocabulary)
        self.field_sizes = [checks.positive_int(f"field_sizes[{i}]", s) for i, s in enumerate(field_sizes)]
        if not self.field_sizes:
            raise ValueError("field_sizes=[] is invalid: expected at least one field")
        self.items_per_sample = checks.positive_int("items_per_sample", items_per_sample)
        self.field_offsets = np.concatenate([[0], np.cumsum(self.field_sizes)[:-1]]).astype(np.int64)
        self._rng = np.random.default_rng(checks.positive_int("seed", seed, allow_zero=True))
        self.truth = {"items": self._rng.normal(0, 0.6, self.item_vocabulary),
                      "fields": self._rng.normal(0, 0.6, sum(self.field_sizes)),
                      "weekday": self._rng.normal(0, 0.3, self.WEEKDAYS)}

    def batch(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The next `n` samples: ``({"items", "fields", "weekday"}: int64 keys, labels [n, 1] float32)``."""
        checks.positive_int("n", n)
        items = self._zipf(self.item_vocabulary, (n, 1, self.items_per_sample))  # (n, 1, items_per_sample)
        fields = np.stack([self._zipf(s, n) for s in self.field_sizes], 1)[:, :, None] + self.field_offsets[:, None]
        weekday = self._rng.integers(0, self.WEEKDAYS, (n, 1))  # (n, 1)
        logit = (self.truth["items"][items].sum((1, 2)) + self.truth["fields"][fields].sum((1, 2))
                 + self.truth["weekday"][weekday[:, 0]])
        labels = (self._rng.random(n) < 1 / (1 + np.exp(-(logit - 0.5)))).astype(np.float32)[:, None]
        return {"items": items, "fields": fields, "weekday": weekday.astype(np.int64)}, labels

    def _zipf(self, size: int, shape: int | tuple[int, ...]) -> np.ndarray:
        return np.minimum(self._rng.zipf(1.2, shape) - 1, size - 1).astype(np.int64)
