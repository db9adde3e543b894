"""How much bucket-local eviction costs in hit rate: an LRU `EmbeddingTable` against exact LRU.

A table with ``eviction_policy="lru"`` evicts the oldest key of the new key's bucket
(`sok_tutorial.embedding.buckets`), not the oldest key of the whole table. `lru_hit_rates`
replays a stream of batches through both, the real table and an exact LRU cache of the same
capacity with the same step semantics (a step's keys are touched together, and none of them is
evicted in that step), and returns the share of each step's distinct keys that found a row.
``benchmarks/embedding.py --group eviction`` and notebook 08 report it. `admission_hit_rates`
replays a stream through an LRU table that admits keys seen ``min_count`` times beside one that
admits every key (the benchmark reports it too).

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

from kernels import checks


def _stream(batches: Iterable[Any], capacity: Any, skip: Any = 0) -> list[np.ndarray]:
    """`batches` as a list of integer arrays, once `capacity` and `skip` are checked against them."""
    checks.positive_int("capacity", capacity)
    out = [np.asarray(batch) for batch in batches]
    if not out:
        raise ValueError("batches is empty: expected at least one batch of keys")
    kinds = {batch.dtype.kind for batch in out}
    if not kinds <= set("iu"):
        raise ValueError(f"batches must hold integer keys, got dtypes {sorted(str(b.dtype) for b in out)[:3]}")
    if checks.positive_int("skip", skip, allow_zero=True) >= len(out):
        raise ValueError(f"skip={skip} is invalid: expected fewer than the {len(out)} batches (the steps to rate)")
    return out


def exact_lru_hits(batches: Iterable[Any], capacity: int) -> list[tuple[int, int]]:
    """(hits, distinct keys) of each batch through an exact LRU cache of `capacity` keys."""
    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for batch in _stream(batches, capacity):
        keys = list(dict.fromkeys(batch.reshape(-1).tolist()))  # distinct, first-seen order
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


def table_hits(batches: Iterable[Any], capacity: int, bucket_capacity: int = 8,
               **options: Any) -> tuple[list[tuple[int, int]], int]:
    """((hits, distinct keys) of each batch through an LRU `EmbeddingTable` with table `options`
    (``min_count=2``...), its real capacity). Each training lookup gets each key's occurrences in
    its batch, as a layer's lookup does."""
    import tensorflow as tf

    from sok_tutorial.embedding.table import EmbeddingTable

    table = EmbeddingTable(capacity, 1, eviction_policy="lru", bucket_capacity=bucket_capacity, **options)
    table.build()
    spec = [tf.TensorSpec([None], tf.int64)]
    found = tf.function(lambda keys: tf.reduce_sum(tf.cast(table.rows(keys, insert=False)[1], tf.int64)),
                        input_signature=spec)
    train = tf.function(lambda keys, counts: table.rows(keys, insert=True, counts=counts)[0],
                        input_signature=spec * 2)
    out = []
    for batch in batches:
        keys, _, counts = tf.unique_with_counts(tf.constant(np.asarray(batch, np.int64).reshape(-1)),
                                                out_idx=tf.int64)
        out.append((int(found(keys)), int(tf.size(keys))))
        train(keys, counts)
    return out, table.capacity


def _rate(pairs: list[tuple[int, int]], skip: int) -> float:
    """Hits over distinct keys, summed over the steps after the first `skip`."""
    pairs = pairs[skip:]
    return sum(h for h, _ in pairs) / max(1, sum(n for _, n in pairs))


def admission_hit_rates(batches: list[Any], capacity: int, min_count: int = 2, skip: int = 0,
                        **options: Any) -> dict[str, Any]:
    """Hit rates of an LRU table that admits keys seen `min_count` times (with table `options`, such as
    ``sketch_width``) and of one that admits every key, of the same capacity: what keeping one-off
    keys out leaves for the others.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> recurring = np.arange(50)  # seen every other step; 200 keys seen once come every step
        >>> batches = [np.r_[recurring[:50 * (t % 2 == 0)], rng.integers(10**6, 10**9, 200)] for t in range(12)]
        >>> rates = admission_hit_rates(batches, capacity=64, skip=4, sketch_width=4096)
        >>> rates["admitted"] > rates["every_key"]
        True
    """
    batches = _stream(batches, capacity, skip)
    admitted, rows = table_hits(batches, capacity, min_count=min_count, **options)
    every, _ = table_hits(batches, capacity)
    return {"admitted": _rate(admitted, skip), "every_key": _rate(every, skip), "capacity": rows,
            "min_count": min_count, "steps": len(batches) - skip}


def lru_hit_rates(batches: list[Any], capacity: int, bucket_capacity: int = 8, skip: int = 0) -> dict[str, Any]:
    """Hit rates (hits / distinct keys, summed over the steps after the first `skip`) of an LRU table
    with buckets of `bucket_capacity` and of exact LRU at the table's capacity."""
    batches = _stream(batches, capacity, skip)
    bucketed, rows = table_hits(batches, capacity, bucket_capacity)
    exact = exact_lru_hits(batches, rows)
    return {"bucketed": _rate(bucketed, skip), "exact": _rate(exact, skip), "capacity": rows,
            "steps": len(batches) - skip}
