"""Eviction, admission and change tracking of `EmbeddingTable` (`sok_tutorial.embedding.lifecycle`).

The tables are checked against `Reference`, a plain-Python twin of the policies that assigns
rows the same way (free rows reused last-freed-first, then fresh rows), so each step's key -> row
map must match exactly.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from sok_tutorial.embedding import EmbeddingTable, lifecycle, lifecycle_ops

BINS = lifecycle_ops.BINS


class Reference:
    """The policies of `lifecycle`, one key at a time."""

    def __init__(self, capacity: int, policy: str, fraction: float, ttl: int | None = None, decay: float = 0.5):
        self.capacity, self.policy, self.fraction, self.ttl, self.decay = capacity, policy, fraction, ttl, decay
        self.row_of: dict[int, int] = {}
        self.key_of: dict[int, int] = {}
        self.seen: dict[int, int] = {}
        self.count: dict[int, int] = {}
        self.free: list[int] = []
        self.size = self.clock = self.last_expiry = 0
        self.evicted: list[int] = []

    def _bin(self, row: int, now: int) -> int:
        if self.policy == "lfu":
            return BINS - 1 - min(self.count[row], BINS - 1)
        age = now - self.seen[row]
        return min(age * 1024 // (self.ttl + 1), BINS - 1) if self.policy == "ttl" else min(age, BINS - 1)

    def step(self, batch: np.ndarray) -> None:
        self.clock += 1
        now = self.clock
        unique, first, counts = np.unique(batch, return_index=True, return_counts=True)
        order = np.argsort(first)  # tf.unique's order: first occurrence
        unique, counts = unique[order].tolist(), counts[order].tolist()
        new = []
        for key, c in zip(unique, counts):
            if key in self.row_of:
                self.seen[self.row_of[key]] = now
                self.count[self.row_of[key]] += c
            else:
                new.append((key, c))
        need = len(new) - (self.capacity - self.size) - len(self.free)
        due = self.policy == "ttl" and now - self.last_expiry >= max(1, self.ttl // 4)
        if need > 0 or due:
            want = max(need, math.ceil(self.fraction * self.capacity)) if need > 0 else 0
            candidates = [r for r in range(self.size) if r in self.key_of and self.seen[r] != now]
            if self.policy == "ttl":
                want = max(want, sum(self._bin(r, now) >= 1024 for r in candidates))
            chosen = sorted(candidates, key=lambda r: (-self._bin(r, now), r))[:want]
            threshold = self._bin(chosen[-1], now) if chosen else BINS
            worse = [r for r in candidates if self._bin(r, now) > threshold]  # freed in row order, then ties
            victims = worse + [r for r in candidates if self._bin(r, now) == threshold][:want - len(worse)]
            for r in victims:
                key = self.key_of.pop(r)
                del self.row_of[key], self.seen[r]
                self.count[r] = 0
                self.evicted.append(key)
            self.free += victims
            self.count = {r: int(np.float32(c) * np.float32(self.decay)) for r, c in self.count.items()}
            self.last_expiry = now
        reused = min(len(new), len(self.free))
        rows = self.free[len(self.free) - reused:] + list(range(self.size, self.size + len(new) - reused))
        del self.free[len(self.free) - reused:]
        self.size += len(new) - reused
        assert self.size <= self.capacity
        for (key, c), row in zip(new, rows):
            self.row_of[key], self.key_of[row], self.seen[row], self.count[row] = row, key, now, c


def table_map(table: EmbeddingTable) -> dict[int, int]:
    keys = table._row_keys.numpy()
    return {int(keys[r]): int(r) for r in lifecycle.live_rows(table)}


def stream(steps: int, batch: int, seed: int = 0, drift: int = 7) -> list[np.ndarray]:
    """Zipf keys whose population drifts: step t draws from keys offset by drift * t."""
    rng = np.random.default_rng(seed)
    return [(rng.zipf(1.3, batch) + drift * t).astype(np.int64) for t in range(steps)]


@pytest.mark.parametrize("policy, ttl", [("lru", None), ("lfu", None), ("ttl", 6)])
def test_rows_follow_the_reference_policy_step_by_step(policy, ttl):
    capacity, fraction = 64, 1 / 8
    table = EmbeddingTable(capacity, 3, eviction_policy=policy, ttl=ttl, evict_fraction=fraction, eviction_log=4096)
    ref = Reference(capacity, policy, fraction, ttl)
    step = tf.function(lambda keys: table(keys, training=True))
    evictions = 0
    for batch in stream(60, 40):
        step(tf.constant(batch))
        ref.step(batch)
        assert table_map(table) == ref.row_of
        assert table.size == len(ref.row_of) <= capacity
        evictions = len(ref.evicted)
    assert evictions > 100  # the stream really forced evictions
    np.testing.assert_array_equal(lifecycle.evicted_since(table, 0), ref.evicted)


def test_evicted_rows_start_from_their_new_keys_initial_vectors_and_are_marked_fresh():
    table = EmbeddingTable(4, 2, eviction_policy="lru", evict_fraction=0.5)
    table(tf.constant([1, 2, 3, 4], tf.int64), training=True)
    table.fresh_rows(tf.range(4, dtype=tf.int64))  # an optimizer took the first marks
    table.variable.assign(tf.ones([4, 2]) * 9.0)  # trained values
    table(tf.constant([3, 4, 10], tf.int64), training=True)  # evicts 1 and 2 (oldest); 10 takes a row
    row = table_map(table)[10]
    np.testing.assert_allclose(table.variable.numpy()[row], table.initial_values([10])[0])
    fresh = table.fresh_rows(tf.range(4, dtype=tf.int64)).numpy()
    assert fresh.tolist() == [r == row for r in range(4)]
    assert not table.fresh_rows(tf.range(4, dtype=tf.int64)).numpy().any()  # taking the marks cleared them


def test_keys_in_use_this_step_are_never_evicted():
    table = EmbeddingTable(8, 2, eviction_policy="lru", evict_fraction=1.0)  # evict as much as possible
    table(tf.constant(np.arange(8), tf.int64), training=True)
    out = table(tf.constant([0, 1, 2, 100], tf.int64), training=True)
    assert {0, 1, 2, 100} <= set(table_map(table))
    assert table.size == 4  # everything else went
    assert out.shape == (4, 2)


def test_a_batch_with_more_distinct_keys_than_rows_is_an_error_naming_the_table():
    table = EmbeddingTable(4, 2, eviction_policy="lru", name="tiny")
    with pytest.raises(tf.errors.InvalidArgumentError, match="tiny: vocabulary exhausted.*after eviction"):
        table(tf.constant(np.arange(5), tf.int64), training=True)


def test_tombstones_trigger_a_rebuild_and_lookups_stay_exact():
    table = EmbeddingTable(16, 2, eviction_policy="lru", evict_fraction=1 / 16)  # index of 32 slots
    step = tf.function(lambda keys: table(keys, training=True))
    ref = Reference(16, "lru", 1 / 16)
    rebuilt = False
    for t in range(40):
        batch = np.arange(4 * t, 4 * t + 6, dtype=np.int64)
        tombstones = int(table._tombstones.numpy()) if table.built else 0
        step(tf.constant(batch))
        ref.step(batch)
        rebuilt |= int(table._tombstones.numpy()) < tombstones
        assert table_map(table) == ref.row_of
    assert rebuilt
    keys = np.array(sorted(ref.row_of), np.int64)
    np.testing.assert_allclose(table(tf.constant(keys)).numpy(), table.variable.numpy()[[ref.row_of[k] for k in keys]])


def test_admission_gives_a_row_only_after_min_count_sightings():
    table = EmbeddingTable(100, 2, min_count=3)
    step = tf.function(lambda keys: table(keys, training=True))
    out = step(tf.constant([7, 7, 8], tf.int64))  # 7 seen twice, 8 once
    assert table.size == 0 and not out.numpy().any()  # no rows yet: zeros
    step(tf.constant([7, 9], tf.int64))  # 7 reaches 3
    assert set(table.export()["keys"].tolist()) == {7}
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(table(tf.constant([7, 8], tf.int64), training=True))
    grad = tape.gradient(loss, table.variable)
    assert grad.indices.numpy().tolist() == [table_map(table)[7]]  # the unadmitted key has no gradient row


def test_admission_probability_is_repeatable_and_about_right():
    sizes = []
    for _ in range(2):
        table = EmbeddingTable(5000, 2, admit_probability=0.25)
        table(tf.constant(np.arange(4000), tf.int64), training=True)
        sizes.append(table.size)
    assert sizes[0] == sizes[1] and 850 < sizes[0] < 1150


def test_lfu_counts_occurrences_and_halves_them_at_each_eviction():
    table = EmbeddingTable(4, 2, eviction_policy="lfu", evict_fraction=0.25)
    table(tf.constant([1, 1, 1, 2, 3, 3, 4], tf.int64), training=True)
    assert sorted(zip(table.export()["keys"].tolist(), table.export()["counts"].tolist())) == \
        [(1, 3), (2, 1), (3, 2), (4, 1)]
    table(tf.constant([5], tf.int64), training=True)  # 2 (count 1, first row of the tie) goes
    assert sorted(zip(table.export()["keys"].tolist(), table.export()["counts"].tolist())) == \
        [(1, 1), (3, 1), (4, 0), (5, 1)]


def test_track_changes_on_a_static_table_marks_the_rows_a_training_call_used():
    table = EmbeddingTable(10, 2, dynamic=False, track_changes=True)
    table(tf.constant([1, 2], tf.int64), training=True)
    mark = lifecycle.mark(table)
    table(tf.constant([2, 5], tf.int64), training=True)
    table(tf.constant([9], tf.int64))  # inference: not a change
    assert lifecycle.changed_since(table, mark).tolist() == [2, 5]
    assert lifecycle.changed_since(table, 0).tolist() == [1, 2, 5]


def test_the_eviction_log_refuses_a_mark_it_no_longer_covers():
    table = EmbeddingTable(4, 2, eviction_policy="lru", evict_fraction=0.5, eviction_log=3, name="small_log")
    for t in range(6):
        table(tf.constant([10 * t, 10 * t + 1], tf.int64), training=True)
    assert lifecycle.evicted_since(table, 5).tolist() == [30, 31]  # evicted at clock 6 by the last step
    with pytest.raises(ValueError, match="small_log: the eviction log .*eviction_log=3"):
        lifecycle.evicted_since(table, 1)


def test_export_and_restore_keep_marks_and_counts_and_skip_free_rows():
    table = EmbeddingTable(8, 2, eviction_policy="lfu", evict_fraction=0.5)
    table(tf.constant(np.arange(8), tf.int64), training=True)
    table(tf.constant([0, 0, 100], tf.int64), training=True)
    saved = table.export()
    assert len(saved["keys"]) == table.size == 5  # 4 evicted, 100 took one of their rows
    other = EmbeddingTable(8, 2, eviction_policy="lfu", evict_fraction=0.5)
    other.build()
    other.restore(saved)
    again = other.export()
    for name in ("keys", "vectors", "marks", "counts"):
        np.testing.assert_array_equal(again[name], saved[name])
    assert lifecycle.mark(other) == lifecycle.mark(table)


@pytest.mark.parametrize("kwargs, message", [
    ({"eviction_policy": "fifo"}, "eviction_policy.*fifo.*lru"),
    ({"min_count": 0}, "min_count=0 is invalid.*>= 1"),
    ({"admit_probability": 1.5}, r"admit_probability=1.5 is invalid.*\(0, 1\]"),
    ({"evict_fraction": 0}, "evict_fraction=0 is invalid"),
    ({"ttl": 5}, "ttl=5.*need eviction_policy='ttl'"),
    ({"eviction_policy": "ttl"}, "exactly one of ttl"),
    ({"eviction_policy": "lru", "dynamic": False}, "need a dynamic table"),
    ({"eviction_policy": "ttl", "ttl_seconds": float("inf")}, r"ttl_seconds=inf is invalid.*less than"),
    ({"eviction_policy": "ttl", "ttl_seconds": 1e300}, r"ttl_seconds=1e\+300 is invalid"),
    ({"eviction_policy": "ttl", "ttl_seconds": float("nan")}, r"ttl_seconds=nan is invalid"),
    ({"eviction_policy": "ttl", "ttl": 2**62}, r"ttl=4611686018427387904 is invalid.*fewer than"),
    ({"track_changes": "no"}, r"track_changes='no' is invalid: expected True or False"),
    ({"capacity": 0}, "capacity"),
])
def test_bad_options_are_refused_naming_the_argument(kwargs, message):
    args = {"capacity": 10, "dim": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        EmbeddingTable(**args)


def test_lifecycle_options_survive_get_config():
    table = EmbeddingTable(10, 2, eviction_policy="ttl", ttl=4, min_count=2)
    again = EmbeddingTable.from_config(table.get_config())
    assert again.lifecycle == table.lifecycle


def test_the_sok_layers_hand_lifecycle_options_to_their_table():
    import sok_tutorial as sok

    layer = sok.DistributedEmbedding("sum", 6, 2, slot_num=2, max_nnz=1, eviction_policy="lru", evict_fraction=0.5)
    for t in range(5):
        layer(tf.constant([[4 * t, 4 * t + 1], [4 * t + 2, 4 * t + 3]], tf.int64), training=True)
    assert layer.table.lifecycle.eviction_policy == "lru" and layer.table.size <= 6
    again = sok.DistributedEmbedding.from_config(layer.get_config())
    again.build()
    assert again.table.lifecycle == layer.table.lifecycle


def test_admission_counts_survive_a_checkpoint(tmp_path):
    """A key seen min_count - 1 times before a save needs one more sighting after the restore."""
    import keras

    from sok_tutorial.training import load_checkpoint, save_checkpoint

    def model() -> tuple[keras.Model, EmbeddingTable]:
        table = EmbeddingTable(16, 2, min_count=3, name="items")
        return keras.Sequential([keras.Input((1,), dtype="int64"), table]), table

    saved, table = model()
    for _ in range(2):
        table(tf.constant([7, 8], tf.int64), training=True)
    table(tf.constant([8], tf.int64), training=True)
    assert sorted(table.export()["keys"].tolist()) == [8]  # 7 seen twice: not admitted yet
    save_checkpoint(tmp_path / "ckpt", saved)
    restored, again = model()
    again(tf.constant([1], tf.int64), training=False)  # builds it
    load_checkpoint(tmp_path / "ckpt", restored)
    again(tf.constant([7], tf.int64), training=True)
    assert sorted(again.export()["keys"].tolist()) == [7, 8]


def test_a_sketch_of_another_shape_is_not_restored(tmp_path):
    """Depth 4 x width 16 holds as many counters as 2 x 32, but not the same counts: skipped, with a warning."""
    import keras

    from sok_tutorial.training import load_checkpoint, save_checkpoint

    def model(depth: int, width: int) -> tuple[keras.Model, EmbeddingTable]:
        table = EmbeddingTable(16, 2, min_count=3, sketch_depth=depth, sketch_width=width, name="items")
        return keras.Sequential([keras.Input((1,), dtype="int64"), table]), table

    saved, table = model(4, 16)
    table(tf.constant([7, 7], tf.int64), training=True)
    save_checkpoint(tmp_path / "ckpt", saved)
    restored, again = model(2, 32)
    again(tf.constant([1], tf.int64), training=False)
    with pytest.warns(RuntimeWarning, match=r"sketch \(saved \(4, 16\), this table \(2, 32\)\)"):
        load_checkpoint(tmp_path / "ckpt", restored)
    assert not again._sketch.numpy().any()
