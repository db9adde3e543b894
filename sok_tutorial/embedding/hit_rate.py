"""How much bucket-local eviction costs in hit rate: an LRU `EmbeddingTable` against exact LRU.

A table with ``eviction_policy="lru"`` evicts the oldest key of the new key's bucket
(`sok_tutorial.embedding.buckets`), not the oldest key of the whole table. `lru_hit_rates`
replays a stream of batches through both, the real table and an exact LRU cache of the same
capacity with the same step semantics (a step's keys are touched together, and none of them is
evicted in that step), and returns the share of each step's distinct keys that found a row.
``benchmarks/embedding.py --group eviction`` and notebook 08 report it.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> batches = [rng.zipf(1.2, 2000) + 50 * t for t in range(12)]
    >>> rates = lru_hit_rates(batches, capacity=1024)
    >>> sorted(rates), rates["capacity"]
    (['bucketed', 'capacity', 'exact', 'steps'], 1024)
    >>> abs(rates["bucketed"] - rates["exact"]) < 0.05
    True
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np


def exact_lru_hits(batches: Iterable[Any], capacity: int) -> list[tuple[int, int]]:
    """(hits, distinct keys) of each batch through an exact LRU cache of `capacity` keys."""
    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for batch in batches:
        keys = list(dict.fromkeys(np.asarray(batch).reshape(-1).tolist()))  # distinct, first-seen order
        step, hits = set(keys), 0
        for key in keys:
            if key in cache:
                hits += 1
                cache.move_to_end(key)
        for key in keys:
            if key not in cache:
                if len(cache) >= capacity:
                    if next(iter(cache)) in step:  # the oldest key is this step's: all are, no room
                        continue
                    cache.popitem(last=False)
                cache[key] = None
        out.append((hits, len(keys)))
    return out


def table_hits(batches: Iterable[Any], capacity: int, bucket_capacity: int = 8) -> tuple[list[tuple[int, int]], int]:
    """((hits, distinct keys) of each batch through an LRU `EmbeddingTable`, its real capacity)."""
    import tensorflow as tf

    from sok_tutorial.embedding.table import EmbeddingTable

    table = EmbeddingTable(capacity, 1, eviction_policy="lru", bucket_capacity=bucket_capacity)
    table.build()
    spec = [tf.TensorSpec([None], tf.int64)]
    found = tf.function(lambda keys: tf.reduce_sum(tf.cast(table.rows(keys, insert=False)[1], tf.int64)),
                        input_signature=spec)
    train = tf.function(lambda keys: table.rows(keys, insert=True)[0], input_signature=spec)
    out = []
    for batch in batches:
        keys = tf.unique(tf.constant(np.asarray(batch, np.int64).reshape(-1)))[0]
        out.append((int(found(keys)), int(tf.size(keys))))
        train(keys)
    return out, table.capacity


def lru_hit_rates(batches: list[Any], capacity: int, bucket_capacity: int = 8, skip: int = 0) -> dict[str, Any]:
    """Hit rates (hits / distinct keys, summed over the steps after the first `skip`) of an LRU table
    with buckets of `bucket_capacity` and of exact LRU at the table's capacity."""
    bucketed, rows = table_hits(batches, capacity, bucket_capacity)
    exact = exact_lru_hits(batches, rows)

    def rate(pairs: list[tuple[int, int]]) -> float:
        pairs = pairs[skip:]
        return sum(h for h, _ in pairs) / max(1, sum(n for _, n in pairs))

    return {"bucketed": rate(bucketed), "exact": rate(exact), "capacity": rows, "steps": len(batches) - skip}
