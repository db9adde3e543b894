"""A click stream whose keys drift, for online training (notebook 08).

Each day draws `rows` impressions of a user and an item, each from a window of `population` live
keys with Zipf(1.2) popularity that is fixed for a key's life. Every day the windows slide:
`item_drift` new items arrive and as many of the oldest stop, never to be seen again (users by
`user_drift`), so an item lives ``population / item_drift`` days. A click depends on a hidden
preference vector of the user and of the item (a smooth function of the key: no lookup table)
plus an item and a user bias, so a model can learn it only for keys it holds rows for. Users and
items share one key space (disjoint ranges), as they share one table.

Example:
    >>> keys, labels = drifting_day(0, rows=4, population=100, item_drift=10, user_drift=5)
    >>> keys.shape, labels.shape, bool((keys[:, 1] >= ITEM_BASE).all())
    ((4, 2), (4, 1), True)
"""
from __future__ import annotations

import numpy as np

USER_BASE, ITEM_BASE = 10**9, 2 * 10**9  # users and items share one table: disjoint key ranges
_FREQS = np.linspace(0.37, 2.9, 4)


def hidden(keys: np.ndarray) -> np.ndarray:
    """The true preference vector of each key ``[n, 4]``."""
    keys = np.asarray(keys, np.int64)
    return np.sin(keys[:, None] * _FREQS[None, :] + (keys[:, None] % 7))


def drifting_day(day: int, *, rows: int, population: int, item_drift: int, user_drift: int,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Day `day` of the stream: keys ``[rows, 2]`` int64 (user, item) and clicks ``[rows, 1]`` float32.
    The same arguments give the same day, in any process."""
    rng = np.random.default_rng([seed, day])

    def draw(base: int, drift: int) -> np.ndarray:
        alive = base + day * drift + np.arange(population)  # the window of live keys slides by `drift` a day
        weight = (1.0 + (alive * 2654435761) % population) ** -1.2  # a key's popularity: fixed for its life
        return rng.choice(alive, rows, p=weight / weight.sum())

    users, items = draw(USER_BASE, user_drift), draw(ITEM_BASE, item_drift)
    logit = (hidden(users) * hidden(items)).sum(1) + 1.2 * np.cos(items * 0.71) + 0.8 * np.cos(users * 1.13) - 1.0
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return np.stack([users, items], 1).astype(np.int64), labels[:, None]
