"""Eviction, admission and change tracking of `EmbeddingTable` (`sok_tutorial.embedding.lifecycle`).

Tables with a policy are checked against `Reference`, a plain-Python bucketed index that places
keys one at a time by the rules of `sok_tutorial.embedding.buckets`, so each step's key -> slot
map must match the table's exactly.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
import tensorflow as tf

from sok_tutorial.embedding import EmbeddingTable, bucket_search, lfu_words, lifecycle, ops
from sok_tutorial.embedding.bucket_search import first_in_group, nth_lowest, nth_true, position_in_row, rank_in_group
from sok_tutorial.embedding.buckets import bucket_of_np
from sok_tutorial.embedding.hit_rate import admission_hit_rates, exact_lru_hits, lru_hit_rates


class Reference:
    """The bucketed index, one key at a time: hits touched first, then each new key (in the step's
    order) takes the lowest-scored slot of its bucket that no key of this step holds."""

    def __init__(self, capacity: int, width: int, policy: str, ttl: int | None = None, halflife: int = 1000):
        self.width, self.policy, self.ttl, self.halflife = width, policy, ttl, halflife
        self.buckets = capacity // width
        self.keys, self.marks, self.counts = [0] * capacity, [-1] * capacity, [0] * capacity
        self.clock, self.evicted, self.unplaced = 0, [], 0

    def _decayed(self, slot: int, now: int) -> int:
        return self.counts[slot] >> min(now // self.halflife - max(self.marks[slot], 0) // self.halflife, 62)

    def _score(self, slot: int, now: int) -> int:
        if self.policy != "lfu" or self.marks[slot] < 0:
            return self.marks[slot]
        return min(self._decayed(slot, now), 2**31 - 1) * 2**32 + self.marks[slot]

    def step(self, batch: np.ndarray) -> None:
        self.clock += 1
        now = self.clock
        unique, first, counts = np.unique(batch, return_index=True, return_counts=True)
        order = np.argsort(first)  # tf.unique's order: first occurrence
        unique, counts = unique[order], counts[order].tolist()
        new = []
        for key, c, b in zip(unique.tolist(), counts, bucket_of_np(unique, self.buckets).tolist()):
            span = range(b * self.width, (b + 1) * self.width)
            slot = next((s for s in span if self.marks[s] >= 0 and self.keys[s] == key), None)
            if slot is None:
                new.append((key, c, span))
            elif self.policy == "ttl" and now - self.marks[slot] > self.ttl:
                self.marks[slot] = now  # back after expiring: its own slot, a fresh value
            else:
                if self.policy == "lfu":
                    self.counts[slot] = min(self._decayed(slot, now) + c, 2**31 - 1)
                self.marks[slot] = now
        for key, c, span in new:
            free = [s for s in span if self.marks[s] != now]
            if not free:
                self.unplaced += 1
                continue
            slot = min(free, key=lambda s: (self._score(s, now), s))
            if self.marks[slot] >= 0:
                self.evicted.append(self.keys[slot])
            self.keys[slot], self.marks[slot], self.counts[slot] = key, now, c

    def held(self) -> dict[int, int]:
        return {k: s for s, (k, m) in enumerate(zip(self.keys, self.marks)) if m >= 0}


def held(table: EmbeddingTable) -> dict[int, int]:
    """key -> slot of every occupied slot (expired keys included)."""
    marks, keys = table.buckets.marks_np(), table.buckets.keys.numpy().reshape(-1)
    return {int(keys[s]): int(s) for s in np.flatnonzero(marks >= 0)}


def table_map(table: EmbeddingTable) -> dict[int, int]:
    """key -> row of the live keys."""
    rows, keys, _ = table.buckets.live(lifecycle.mark(table))
    return dict(zip(keys.tolist(), rows.tolist()))


def stream(steps: int, batch: int, seed: int = 0, drift: int = 7) -> list[np.ndarray]:
    """Zipf keys whose population drifts: step t draws from keys offset by drift * t."""
    rng = np.random.default_rng(seed)
    return [(rng.zipf(1.3, batch) + drift * t).astype(np.int64) for t in range(steps)]


@pytest.mark.parametrize("policy, ttl, capacity, width", [("lru", None, 64, 8), ("lfu", None, 64, 8),
                                                          ("ttl", 6, 64, 8), ("lru", None, 60, 4),
                                                          ("lfu", None, 48, 16)])
def test_slots_follow_the_bucketed_reference_step_by_step(policy, ttl, capacity, width):
    table = EmbeddingTable(capacity, 3, eviction_policy=policy, ttl=ttl, bucket_capacity=width, eviction_log=4096,
                           **({"lfu_halflife": 5} if policy == "lfu" else {}))
    ref = Reference(table.capacity, width, policy, ttl, halflife=5)
    step = tf.function(lambda keys: table(keys, training=True))
    for batch in stream(60, 40):
        step(tf.constant(batch))
        ref.step(batch)
        assert held(table) == ref.held()
        if policy == "lfu":  # the counts stored beside the marks, as the reference keeps them
            rows = np.array(sorted(ref.held().values()), np.int64)
            assert table.state.row_counts(rows).tolist() == [ref.counts[s] for s in rows]
    assert len(ref.evicted) > 100  # the stream really forced evictions
    np.testing.assert_array_equal(lifecycle.evicted_since(table, 0)[:len(ref.evicted)], ref.evicted)
    assert table.unplaced == ref.unplaced


@pytest.mark.parametrize("limit", [None, 1, 3])
@pytest.mark.parametrize("groups", [[], [7], [1, 0, 1, 1], [5] * 20,
                                    np.random.default_rng(0).integers(0, 40, 500).tolist()])
def test_rank_in_group_counts_the_earlier_elements_of_each_group(groups, limit):
    """The rank that orders several new keys of one bucket: earlier keys of the same bucket, at
    most `limit` (a bucket's width: a key ranked there has no slot left)."""
    ids = np.asarray(groups, np.int64)
    first = [int(np.argmax(ids == g)) for g in ids]
    rank = rank_in_group(tf.constant(first, tf.int32), limit=limit)
    earlier = [int(np.sum(ids[:i] == ids[i])) for i in range(len(ids))]
    assert rank.numpy().tolist() == [e if limit is None else min(e, limit) for e in earlier]
    later = np.flatnonzero(np.array(first, np.int64) != np.arange(len(ids)))  # as a caller that has them passes
    given = rank_in_group(tf.constant(first, tf.int32), limit=limit, later=tf.constant(later, tf.int64))
    assert given.numpy().tolist() == rank.numpy().tolist()


@pytest.mark.parametrize("bound", [40, 10**6])  # a dense array of the bound; tf.unique's map (bound > 32 n)
@pytest.mark.parametrize("groups", [[], [7], [1, 0, 1, 1], [5] * 20,
                                    np.random.default_rng(1).integers(0, 40, 500).tolist()])
def test_first_in_group_finds_each_elements_first_equal(groups, bound):
    """Which new key is the first of its bucket in the step's order, by either of the two ways (a
    bucket's first new key writes the bucket's row; the others rank behind it)."""
    ids = np.asarray(groups, np.int64)
    assert (bound <= bucket_search.DENSE_PER_ELEMENT * len(ids)) == (bound == 40 and len(ids) >= 2)
    first = tf.function(lambda v: first_in_group(v, bound))(tf.constant(ids, tf.int32))
    assert first.numpy().tolist() == [int(np.argmax(ids == g)) for g in ids]


@pytest.mark.parametrize("reads", [1, 3, 200, 1000])  # 1 and 3: a resource gather; 200, 1000: a copy and a gather
@pytest.mark.parametrize("dtype", [tf.bool, tf.int32, tf.int64])
def test_read_elements_reads_either_way(reads, dtype):
    """Single elements of a variable (a table's fresh-row marks): few by a resource gather, many by one
    read of the whole variable; after scatters and with repeated indices, both give the same values."""
    size, rng = 4096, np.random.default_rng(reads)
    values = tf.Variable(tf.cast(rng.integers(0, 2 if dtype == tf.bool else 1000, size), dtype))
    values.scatter_update(tf.IndexedSlices(tf.cast(tf.constant([1, 0]), dtype), tf.constant([3, 100])))
    at = rng.integers(0, size, reads)
    at[-1] = at[0]
    assert (reads * ops.COPY_PER_GATHERED >= size) == (reads >= 200)
    got = tf.function(lambda i: ops.read_elements(values, i))(tf.constant(at))
    np.testing.assert_array_equal(got.numpy(), values.numpy()[at])


@pytest.mark.parametrize("dtype", [tf.bool, tf.int32, tf.int64, tf.float16, tf.float32])
@pytest.mark.parametrize("shape", [(), (5,), (3, 2)])
def test_take_reads_what_tf_gather_reads(dtype, shape):
    """`ops.take` (GatherNd) gives tf.gather's values for indices of any rank and either integer type,
    from tensors and variables, with the same sparse gradient; booleans go by Gather itself (GatherNd
    has no GPU kernel for them)."""
    rng = np.random.default_rng(len(shape))
    values = tf.cast(rng.integers(0, 2 if dtype == tf.bool else 100, (7, 3)), dtype)
    variable = tf.Variable(values)
    for index_dtype in (np.int32, np.int64):
        at = tf.constant(rng.integers(0, 7, shape).astype(index_dtype))
        np.testing.assert_array_equal(ops.take(values, at).numpy(), tf.gather(values, at).numpy())
        np.testing.assert_array_equal(ops.take(variable, at).numpy(), tf.gather(values, at).numpy())
    graph = tf.function(lambda: ops.take(variable, tf.constant([1, 1]))).get_concrete_function().graph
    kinds = {op.type for op in graph.get_operations()}
    assert ("ResourceGather" if dtype == tf.bool else "ResourceGatherNd") in kinds
    if dtype == tf.float32:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ops.take(variable, tf.constant([4, 1, 4])) * 2.0)
        gradient = tape.gradient(loss, variable)
        assert isinstance(gradient, tf.IndexedSlices)  # (a dense gradient would be a pass over the whole table)
        np.testing.assert_array_equal(tf.convert_to_tensor(gradient).numpy()[[1, 4, 0]],
                                      [[2.0] * 3, [4.0] * 3, [0.0] * 3])


@pytest.mark.parametrize("dtype", [tf.bool, tf.int32, tf.int64, tf.float32])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64, tf.uint8])
@pytest.mark.parametrize("n, k", [(0, 0), (5, 0), (5, 5), (200, 37)])
def test_updated_replaces_exactly_the_elements_named(dtype, index_dtype, n, k):
    """`ops.updated` (SparseToDense for 1-D values, a stitch for rows) against NumPy: every element
    named is replaced, every other kept, for each value and index type, none, some and all updated."""
    rng = np.random.default_rng(n + k)
    values = rng.integers(0, 2 if dtype == tf.bool else 1000, (n, 3))
    at = rng.permutation(n)[:k]
    updates = rng.integers(0, 2 if dtype == tf.bool else 1000, (k, 3))
    expected = values.copy()
    expected[at] = updates
    for rows in (False, True):  # 1-D values, and rows of three
        v, u, e = (values, updates, expected) if rows else (values[:, 0], updates[:, 0], expected[:, 0])
        got = ops.updated(tf.cast(v, dtype), tf.cast(at, index_dtype), tf.cast(u, dtype))
        np.testing.assert_array_equal(got.numpy(), e.astype(got.dtype.as_numpy_dtype))


@pytest.mark.parametrize("spans", [1, 3, 40, 200])  # 1 and 3: gathered element by element; 40, 200: read as rows
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_read_spans_reads_each_bucket_s_marks_either_way(spans, dtype):
    """The marks of new keys' buckets (`read_spans`): few buckets by single elements, many by one
    read of the whole variable as rows; after scatters (which make TensorFlow copy on a dense read)
    and with the same bucket twice, both give the same values."""
    width, size = 8, 8 * 512
    rng = np.random.default_rng(spans)
    marks = tf.Variable(tf.cast(rng.integers(-1, 1000, size), dtype))
    marks.scatter_update(tf.IndexedSlices(tf.constant([7, 7 * 8], dtype), tf.constant([3, 100])))
    buckets = rng.integers(0, size // width, spans)
    buckets[-1] = buckets[0]
    assert (spans * width * ops.COPY_PER_GATHERED >= size) == (spans >= 40)
    got = tf.function(lambda b: ops.read_spans(marks, b, width))(tf.constant(buckets, tf.int32))
    np.testing.assert_array_equal(got.numpy(), marks.numpy().reshape(-1, width)[buckets])


@pytest.mark.parametrize("width", [4, 8, 16])
def test_nth_true_finds_a_new_key_s_empty_row(width):
    """The rank-th empty row of a bucket (a new key with `rank` new keys before it in its bucket), or
    -1 where the bucket has no more empty rows than that."""
    rng = np.random.default_rng(width)
    mask = rng.random((400, width)) < rng.choice([0.0, 0.2, 0.7, 1.0], (400, 1))
    n = rng.integers(0, width, 400).astype(np.int32)
    n[:100] = 0  # the common case: the first new key of its bucket
    at = nth_true(tf.constant(mask), tf.constant(n))
    expected = np.array([np.flatnonzero(m)[k] if k < m.sum() else -1 for m, k in zip(mask, n)])
    assert at.numpy().tolist() == expected.tolist()


@pytest.mark.parametrize("width,dtype", [(2, np.int32), (8, np.int32), (8, np.int64), (16, np.int32)])
def test_nth_lowest_is_the_nth_of_a_stable_sort(width, dtype):
    """A later new key's row: the n-th of its bucket's scores in stable sorted order, ties (many: step
    marks, empty rows' -1, the dtype's largest for rows held this step) by position."""
    rng = np.random.default_rng(width)
    top = np.iinfo(dtype).max
    score = rng.choice(np.array([-1, 0, 1, 2, 3, 7, top], dtype), (500, width))
    n = rng.integers(1, width, 500).astype(np.int32)
    n[:300] = 1  # the common case: the second new key of its bucket
    lowest = np.argmin(score, axis=1).astype(np.int32)
    found = nth_lowest(tf.constant(score), tf.constant(lowest), tf.constant(n)).numpy()
    expected = np.argsort(score, axis=1, kind="stable")[np.arange(500), n]
    assert found.tolist() == expected.tolist()
    assert nth_lowest(tf.zeros([0, width], dtype), tf.zeros([0], tf.int32), tf.zeros([0], tf.int32)).shape == (0,)


@pytest.mark.parametrize("width", [8, 16])
def test_bucket_searches_on_a_big_endian_host_find_the_same_slots(width, monkeypatch):
    """On a big-endian host (``sys.byteorder`` patched) the searches leave the packing of slots into
    the bytes of a word, whose byte order the host decides, and give the slots the packing gives here."""
    rng = np.random.default_rng(width)
    mask = rng.random((300, width)) < rng.choice([0.0, 0.2, 0.7, 1.0], (300, 1))
    n = rng.integers(0, width, 300).astype(np.int32)
    where = rng.integers(-1, width, 300)
    match = np.zeros((300, width), bool)
    match[np.flatnonzero(where >= 0), where[where >= 0]] = True
    little = nth_true(tf.constant(mask), tf.constant(n)).numpy(), position_in_row(tf.constant(match)).numpy()
    monkeypatch.setattr(sys, "byteorder", "big")
    big = nth_true(tf.constant(mask), tf.constant(n)).numpy(), position_in_row(tf.constant(match)).numpy()
    assert big[0].tolist() == little[0].tolist() and big[1].tolist() == little[1].tolist() == where.tolist()
    spec = tf.TensorSpec([None, width], tf.bool)
    for search in (lambda m: nth_true(m, tf.zeros(tf.shape(m)[:1], tf.int32)), position_in_row):
        graph = tf.function(search).get_concrete_function(spec).graph
        assert "PopulationCount" not in {op.type for op in graph.get_operations()}  # (no word packing)


@pytest.mark.parametrize("width", [2, 4, 8, 16, 32])
def test_position_finds_the_one_match_of_each_bucket_row(width):
    """A lookup's slot within its bucket: every position of the row (the last byte of an 8-slot word
    included) and -1 where no slot matches."""
    rng = np.random.default_rng(width)
    where = np.concatenate([np.arange(-1, width), rng.integers(-1, width, 300)])
    match = np.zeros((len(where), width), bool)
    match[np.flatnonzero(where >= 0), where[where >= 0]] = True
    assert position_in_row(tf.constant(match)).numpy().tolist() == where.tolist()


def test_capacity_is_rounded_up_to_whole_buckets_and_the_index_is_12_bytes_a_row():
    table = EmbeddingTable(100, 2, eviction_policy="lru")
    assert table.capacity == 104 and table.index_bytes_per_row == 12
    assert EmbeddingTable(100, 2, eviction_policy="lfu", bucket_capacity=16).capacity == 112
    assert EmbeddingTable(100, 2, eviction_policy="lfu").index_bytes_per_row == 16
    assert EmbeddingTable(128, 2).index_bytes_per_row == 40 and EmbeddingTable(100, 2).capacity == 100
    table.build()
    assert table.variable.shape == (104, 2) and table.buckets.keys.shape == (13, 8)


def test_every_int64_is_a_key_and_an_empty_slot_matches_none():
    table = EmbeddingTable(16, 2, eviction_policy="lru", name="edge")
    keys = tf.constant([0, -1, -(2**63), 2**63 - 1], tf.int64)
    assert not table(keys).numpy().any() and table.size == 0  # empty slots hold key 0: no match
    table(keys, training=True)
    assert sorted(table.export()["keys"].tolist()) == sorted(keys.numpy().tolist())
    np.testing.assert_allclose(table(keys).numpy(), table.initial_values(keys.numpy()), rtol=1e-6)


def test_evicted_rows_start_from_their_new_keys_initial_vectors_and_are_marked_fresh():
    table = EmbeddingTable(4, 2, eviction_policy="lru", bucket_capacity=4)
    table(tf.constant([1, 2, 3, 4], tf.int64), training=True)
    table.fresh_rows(tf.range(4, dtype=tf.int64))  # an optimizer took the first marks
    table.variable.assign(tf.ones([4, 2]) * 9.0)  # trained values
    table(tf.constant([3, 4, 10], tf.int64), training=True)  # evicts 1 (oldest, first slot); 10 takes its row
    row = table_map(table)[10]
    assert 1 not in table_map(table) and lifecycle.evicted_since(table, 0).tolist() == [1]
    np.testing.assert_allclose(table.variable.numpy()[row], table.initial_values([10])[0])
    fresh = table.fresh_rows(tf.range(4, dtype=tf.int64)).numpy()
    assert fresh.tolist() == [r == row for r in range(4)]
    assert not table.fresh_rows(tf.range(4, dtype=tf.int64)).numpy().any()  # taking the marks cleared them


def test_optimizer_slots_written_with_a_key_are_its_state_not_restarted_at_the_next_update():
    import sok_tutorial as sok

    table = EmbeddingTable(4, 2, eviction_policy="lru", bucket_capacity=4)
    opt = sok.optimizers.Adagrad(0.1, initial_accumulator_value=0.0)
    table(tf.constant([1, 2, 3, 4], tf.int64), training=True)
    opt.build([table.variable])
    table(tf.constant([1, 2, 3, 4], tf.int64), training=True)  # (a new step: 1 is no longer in use)
    vectors, accumulators = np.ones((1, 2), np.float32), np.full((1, 2), 4.0, np.float32)
    table.write([10], {"vectors": vectors, "slot_0": accumulators}, opt)  # evicts 1; 10 brings its slots
    row = table_map(table)[10]
    assert table.export(opt)["slot_0"][table.export(opt)["keys"] == 10].tolist() == accumulators.tolist()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(table(tf.constant([10], tf.int64), training=True))
    opt.apply(tape.gradient(loss, [table.variable]), [table.variable])
    # Adagrad from the written accumulator (4 + 1), not from a restarted one (0 + 1)
    np.testing.assert_allclose(table.variable.numpy()[row], 1 - 0.1 / np.sqrt(5.0), rtol=1e-5)


def test_keys_in_use_this_step_are_never_evicted():
    table = EmbeddingTable(8, 2, eviction_policy="lru")  # one bucket
    table(tf.constant(np.arange(8), tf.int64), training=True)
    out = table(tf.constant([0, 1, 2, 100], tf.int64), training=True)
    assert {0, 1, 2, 100} <= set(table_map(table)) and table.size == 8
    assert lifecycle.evicted_since(table, 0).tolist() == [3]  # the oldest slot not in use, first in bucket order
    assert out.shape == (4, 2)


def test_new_keys_beyond_their_bucket_get_no_row_that_step_and_are_counted():
    table = EmbeddingTable(4, 2, eviction_policy="lru", bucket_capacity=4, name="tiny")
    out = table(tf.constant([5, 6, 7, 8, 9, 5], tf.int64), training=True)  # 5 distinct keys, one bucket of 4
    assert table.size == 4 and table.unplaced == 1 and table.evictions == 0
    assert set(table_map(table)) == {5, 6, 7, 8}
    assert not out.numpy()[4].any() and out.numpy()[0].any()  # 9 embeds to zeros
    table(tf.constant([9], tf.int64), training=True)  # the next step places it
    assert 9 in table_map(table) and table.evictions == 1


def test_a_ttl_key_expires_lazily_and_comes_back_with_a_fresh_vector():
    table = EmbeddingTable(8, 2, eviction_policy="ttl", ttl=2)
    table(tf.constant([1, 2], tf.int64), training=True)  # clock 1
    table.variable.assign(tf.ones([8, 2]))
    for _ in range(2):
        table(tf.constant([2], tf.int64), training=True)  # clocks 2, 3: key 1 is 2 steps old, alive
    assert set(table_map(table)) == {1, 2}
    table(tf.constant([2], tf.int64), training=True)  # clock 4: key 1 is 3 > ttl steps old
    assert set(table_map(table)) == {2} and not table(tf.constant([1], tf.int64)).numpy().any()
    assert lifecycle.evicted_since(table, 3).tolist() == [1]  # expired after mark 3
    slot = held(table)[1]
    table(tf.constant([1], tf.int64), training=True)
    assert held(table)[1] == slot  # its own slot back
    np.testing.assert_allclose(table.variable.numpy()[slot], table.initial_values([1])[0])


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
    row = table.rows(tf.constant([7], tf.int64), insert=False)[0].numpy().tolist()
    assert grad.indices.numpy().tolist() == row  # the unadmitted key has no gradient row


def test_a_key_is_admitted_by_the_step_its_count_reaches_min_count_however_crowded_the_sketch(monkeypatch):
    """The sketch's estimate never falls below a key's count, also when many keys of one step share
    its cells (a sketch of 3 x 16 counters for 300 keys; it never halves here: 10 x capacity counts
    never pass, and the halving for keys new to it is held off)."""
    from collections import Counter

    from sok_tutorial.embedding import lifecycle_ops
    from sok_tutorial.embedding.lifecycle_ops import _cells

    monkeypatch.setattr(lifecycle_ops, "SKETCH_FILL", 1e9)
    rng, counted = np.random.default_rng(3), Counter()
    table = EmbeddingTable(100_000, 2, min_count=4, sketch_depth=3, sketch_width=16)
    step = tf.function(lambda keys: table(keys, training=True))
    for _ in range(30):
        batch = rng.integers(0, 300, 50)
        step(tf.constant(batch, tf.int64))
        counted.update(batch.tolist())
        held = set(table.export()["keys"].tolist())
        assert {k for k, c in counted.items() if c >= 4} <= held
        waiting = np.array(sorted(set(counted) - held), np.int64)  # still counted in the sketch
        estimate = table.state.sketch.numpy()[_cells(tf.constant(waiting), 3, 16).numpy()].min(axis=0)
        assert (estimate >= [counted[k] for k in waiting]).all()


def test_admission_probability_is_repeatable_and_about_right():
    sizes = []
    for _ in range(2):
        table = EmbeddingTable(5000, 2, admit_probability=0.25)
        table(tf.constant(np.arange(4000), tf.int64), training=True)
        sizes.append(table.size)
    assert sizes[0] == sizes[1] and 850 < sizes[0] < 1150


def test_lfu_counts_occurrences_and_evicts_the_least_counted():
    table = EmbeddingTable(4, 2, eviction_policy="lfu", bucket_capacity=4)
    table(tf.constant([1, 1, 1, 2, 3, 3, 4], tf.int64), training=True)
    assert sorted(zip(table.export()["keys"].tolist(), table.export()["counts"].tolist())) == \
        [(1, 3), (2, 1), (3, 2), (4, 1)]
    table(tf.constant([5], tf.int64), training=True)  # 2 and 4 tie (count 1, same mark): 2 is first in the bucket
    assert sorted(zip(table.export()["keys"].tolist(), table.export()["counts"].tolist())) == \
        [(1, 3), (3, 2), (4, 1), (5, 1)]


@pytest.mark.parametrize("halflife, evicted", [(2, 1), (1000, 2)])
def test_lfu_counts_halve_every_halflife_without_a_sweep(halflife, evicted):
    """Key 1 was seen 8 times long ago, keys 2-4 once a step since: with a short halflife its old
    count has faded below theirs, with a long one it still wins."""
    table = EmbeddingTable(4, 2, eviction_policy="lfu", bucket_capacity=4, lfu_halflife=halflife)
    table(tf.constant([1] * 8, tf.int64), training=True)  # clock 1
    for _ in range(6):
        table(tf.constant([2, 3, 4], tf.int64), training=True)  # clocks 2-7
    table(tf.constant([5], tf.int64), training=True)
    assert lifecycle.evicted_since(table, 0).tolist() == [evicted]


def test_track_changes_on_a_static_table_marks_the_rows_a_training_call_used():
    table = EmbeddingTable(10, 2, dynamic=False, track_changes=True)
    table(tf.constant([1, 2], tf.int64), training=True)
    mark = lifecycle.mark(table)
    table(tf.constant([2, 5], tf.int64), training=True)
    table(tf.constant([9], tf.int64))  # inference: not a change
    assert lifecycle.changed_since(table, mark).tolist() == [2, 5]
    assert lifecycle.changed_since(table, 0).tolist() == [1, 2, 5]


def test_the_eviction_log_refuses_a_mark_it_no_longer_covers():
    table = EmbeddingTable(4, 2, eviction_policy="lru", bucket_capacity=4, eviction_log=3, name="small_log")
    for t in range(6):
        table(tf.constant([10 * t, 10 * t + 1], tf.int64), training=True)
    assert lifecycle.evicted_since(table, 5).tolist() == [30, 31]  # evicted at clock 6 by the last step
    with pytest.raises(ValueError, match="small_log: the eviction log .*eviction_log=3"):
        lifecycle.evicted_since(table, 1)


def test_a_longer_saved_eviction_log_keeps_its_newest_entries_and_says_where_it_starts():
    """A log merged from shards (in mark order) into a shorter ring: the newest entries stay, and
    the log covers only marks after the newest one it let go."""
    table = EmbeddingTable(4, 2, eviction_policy="lru", bucket_capacity=4, eviction_log=4, name="short")
    table.build()
    state = lifecycle.merged_state([{"clock": np.int64(9), "log_keys": np.array([1, 3, 5, 0]),
                                     "log_marks": np.array([1, 3, 5, 0]), "log_total": np.int64(3),
                                     "log_floor": np.int64(0)},
                                    {"clock": np.int64(9), "log_keys": np.array([4, 6, 2]),
                                     "log_marks": np.array([4, 6, 2]), "log_total": np.int64(5),
                                     "log_floor": np.int64(-1)}])  # a ring of 3 that went round: 2, 4, 6
    assert state["log_keys"].tolist() == [1, 2, 3, 4, 5, 6] and int(state["log_floor"]) == 0
    table.state.load(state)
    assert lifecycle.evicted_since(table, 2).tolist() == [3, 4, 5, 6]
    with pytest.raises(ValueError, match="short: the eviction log .* after mark 1 \\(it starts after 2\\)"):
        lifecycle.evicted_since(table, 1)


def test_export_and_restore_keep_marks_and_counts():
    table = EmbeddingTable(8, 2, eviction_policy="lfu")
    table(tf.constant(np.arange(8), tf.int64), training=True)
    table(tf.constant([0, 0, 100], tf.int64), training=True)
    saved = table.export()
    assert len(saved["keys"]) == table.size == 8 and 100 in saved["keys"]
    other = EmbeddingTable(8, 2, eviction_policy="lfu")
    other.build()
    other.restore(saved)
    again = other.export()
    order, back = np.argsort(saved["keys"]), np.argsort(again["keys"])
    for name in ("keys", "vectors", "marks", "counts"):
        np.testing.assert_array_equal(again[name][back], saved[name][order])
    assert lifecycle.mark(other) == lifecycle.mark(table)
    np.testing.assert_allclose(other(tf.constant(saved["keys"])).numpy(), saved["vectors"])


def test_a_restore_into_fewer_buckets_keeps_the_most_recent_keys_of_each_and_says_so():
    table = EmbeddingTable(64, 2, eviction_policy="lru")
    for t in range(8):
        table(tf.constant(np.arange(8 * t, 8 * t + 8), tf.int64), training=True)
    saved = table.export()
    small = EmbeddingTable(16, 2, eviction_policy="lru", name="small")
    small.build()
    with pytest.warns(RuntimeWarning, match=r"small: \d+ of \d+ keys restored did not fit their buckets"):
        small.restore(saved)
    kept = small.export()
    assert 0 < len(kept["keys"]) <= 16
    for bucket in np.unique(bucket_of_np(saved["keys"], 2)):  # each bucket kept its newest keys
        mine = bucket_of_np(saved["keys"], 2) == bucket
        newest = np.sort(saved["marks"][mine])[::-1][:8]
        assert np.sort(kept["marks"][bucket_of_np(kept["keys"], 2) == bucket])[::-1].tolist() == newest.tolist()


@pytest.mark.parametrize("kwargs, message", [
    ({"eviction_policy": "fifo"}, "eviction_policy.*fifo.*lru"),
    ({"min_count": 0}, "min_count=0 is invalid.*from 1"),
    ({"min_count": 2049}, "min_count=2049 is invalid.*to 2048"),
    ({"admit_probability": 1.5}, r"admit_probability=1.5 is invalid.*\(0, 1\]"),
    ({"evict_fraction": 0.5}, "evict_fraction=0.5 is no longer an option"),
    ({"eviction_policy": "lru", "bucket_capacity": 6}, "bucket_capacity=6 is invalid: expected a power of two"),
    ({"eviction_policy": "lru", "bucket_capacity": 2048}, "bucket_capacity=2048 is invalid: expected .* up to 1024"),
    ({"eviction_policy": "lru", "capacity": 4}, "capacity=4 is invalid.*at least one bucket"),
    ({"eviction_policy": "ttl", "ttl": 0}, "ttl"),
    ({"ttl": 5}, "ttl=5.*need eviction_policy='ttl'"),
    ({"eviction_policy": "ttl"}, "exactly one of ttl"),
    ({"eviction_policy": "lru", "dynamic": False}, "need a dynamic table"),
    ({"eviction_policy": "ttl", "ttl_seconds": float("inf")}, r"ttl_seconds=inf is invalid.*less than"),
    ({"eviction_policy": "ttl", "ttl_seconds": 1e300}, r"ttl_seconds=1e\+300 is invalid"),
    ({"eviction_policy": "ttl", "ttl_seconds": float("nan")}, r"ttl_seconds=nan is invalid"),
    ({"eviction_policy": "ttl", "ttl_seconds": 0.0004}, r"ttl_seconds=0.0004 is invalid.*from 0.001"),
    ({"eviction_policy": "ttl", "ttl": 2**62}, r"ttl=4611686018427387904 is invalid.*fewer than"),
    ({"track_changes": "no"}, r"track_changes='no' is invalid: expected True or False"),
    ({"capacity": 0}, "capacity"),
    ({"sketch_width": 4096}, r"sketch_width=4096 has no effect here: it needs min_count > 1 \(admission\)"),
    ({"eviction_policy": "lru", "sketch_depth": 2}, r"sketch_depth=2 has no effect here: it needs min_count > 1"),
    ({"eviction_policy": "lru", "lfu_halflife": 10}, r"lfu_halflife=10 has no effect here: it needs "
                                                     r"eviction_policy='lfu', got eviction_policy='lru'"),
    ({"track_changes": True, "eviction_log": 100}, r"eviction_log=100 has no effect here: it needs an eviction_policy"),
    ({"min_count": 2, "bucket_capacity": 16}, r"bucket_capacity=16 has no effect here: it needs an eviction_policy"),
])
def test_bad_options_are_refused_naming_the_argument(kwargs, message):
    args = {"capacity": 10, "dim": 2, **kwargs}
    with pytest.raises(ValueError, match=message):
        EmbeddingTable(**args)


@pytest.mark.parametrize("kwargs", [{}, {"track_changes": True}, {"min_count": 3}, {"eviction_policy": "lru"},
                                    {"eviction_policy": "lfu", "lfu_halflife": 7, "min_count": 2, "sketch_depth": 2},
                                    {"eviction_policy": "ttl", "ttl": 3, "bucket_capacity": 4, "eviction_log": 9}])
def test_options_at_their_defaults_pass_whatever_applies_and_a_config_builds_its_table_again(kwargs):
    """Options of a feature that is off are accepted at their defaults (as a table's config writes
    them back, every option always), so every table's config builds an equal table."""
    table = EmbeddingTable(64, 2, **kwargs)
    again = EmbeddingTable.from_config(table.get_config())
    assert again.get_config() == table.get_config()
    assert EmbeddingTable(64, 2, **kwargs, **{k: v for k, v in {"sketch_depth": 4, "lfu_halflife": 1000,
                                                                "bucket_capacity": 8}.items() if k not in kwargs})


def test_lifecycle_options_survive_get_config():
    table = EmbeddingTable(10, 2, eviction_policy="ttl", ttl=4, min_count=2)
    again = EmbeddingTable.from_config(table.get_config())
    assert again.lifecycle == table.lifecycle


def test_the_sok_layers_hand_lifecycle_options_to_their_table():
    import sok_tutorial as sok

    layer = sok.DistributedEmbedding("sum", 6, 2, slot_num=2, max_nnz=1, eviction_policy="lru", bucket_capacity=4)
    for t in range(5):
        layer(tf.constant([[4 * t, 4 * t + 1], [4 * t + 2, 4 * t + 3]], tf.int64), training=True)
    assert layer.table.lifecycle.eviction_policy == "lru" and layer.table.size <= layer.table.capacity == 8
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
    assert not again.state.sketch.numpy().any()


def test_a_wall_clock_ttl_table_keeps_millisecond_marks():
    table = EmbeddingTable(16, 2, eviction_policy="ttl", ttl_seconds=3600)
    table(tf.constant([3, 4], tf.int64), training=True)
    assert table.index_bytes_per_row == 16 and table.buckets.marks.dtype == "int64"
    assert (table.export()["marks"] > 1_600_000_000_000).all()  # milliseconds since 1970
    assert sorted(table_map(table)) == [3, 4]


def test_the_admission_sketch_halves_after_ten_counts_per_row():
    """Key 7 seen twice, then 160 counts (10 x capacity 16) halve the sketch: one more sighting
    is not enough any more; in a larger table, whose sketch has not halved yet, it is."""
    def run(capacity: int) -> list[int]:
        table = EmbeddingTable(capacity, 2, min_count=3, sketch_width=4096)  # wide: no collisions to speak of
        table(tf.constant([7, 7], tf.int64), training=True)
        table(tf.constant(np.arange(1000, 1158), tf.int64), training=True)  # 158 more counts: 160 in all
        table(tf.constant([7], tf.int64), training=True)
        return sorted(table.export()["keys"].tolist())

    assert run(16) == [] and run(1000) == [7]


def test_the_admission_sketch_halves_once_a_row_of_keys_new_to_it_came():
    """Key 7 seen twice, then 80 keys new to a sketch of 64 counters a row halve it: one more
    sighting is not enough any more; after 40 new keys it is (no halving yet)."""
    def run(new_keys: int) -> list[int]:
        table = EmbeddingTable(10_000, 2, min_count=3, sketch_width=64)  # (100,000 counts before the other halving)
        table(tf.constant([7, 7], tf.int64), training=True)
        table(tf.constant(np.arange(1000, 1000 + new_keys), tf.int64), training=True)
        table(tf.constant([7], tf.int64), training=True)
        return sorted(table.export()["keys"].tolist())

    assert run(80) == [] and run(40) == [7]


def test_admission_keeps_out_keys_seen_once_however_many_a_stream_brings():
    """Keys seen once each, 400 a step (16,000 in all, 8 times the sketch's width), beside 100 keys
    seen every step: with min_count=2 nearly none of the once-seen keys get a row, though the sketch
    would be full of their counts without its halving, and the others all do."""
    table = EmbeddingTable(1024, 1, eviction_policy="lru", min_count=2)  # a sketch of 4 x 2048 counters
    step = tf.function(lambda keys: table(keys, training=True))
    regular, admitted = np.arange(100) + 10**9, 0
    for i in range(40):
        keys = np.r_[regular, np.arange(400) + 400 * i]
        found = tf.reduce_any(tf.not_equal(step(tf.constant(keys, tf.int64)), 0), axis=1).numpy()
        if i >= 20:
            assert found[:100].all()
            admitted += int(found[100:].sum())
    assert admitted < 0.1 * 20 * 400  # (without the halving for new keys, nearly all are)


def test_an_int32_sketch_of_a_checkpoint_before_float16_counters_restores_saturated(tmp_path):
    import keras

    from sok_tutorial.training import load_checkpoint, save_checkpoint

    def model() -> tuple[keras.Model, EmbeddingTable]:
        table = EmbeddingTable(16, 2, min_count=3, sketch_width=16, name="items")
        return keras.Sequential([keras.Input((1,), dtype="int64"), table]), table

    saved, table = model()
    table(tf.constant([7, 7], tf.int64), training=True)
    save_checkpoint(tmp_path / "ckpt", saved)
    [kept] = (tmp_path / "ckpt" / "tables").glob("*.lifecycle.npz")
    state = dict(np.load(kept))
    assert state["sketch"].dtype == np.float16
    state["sketch"] = state["sketch"].astype(np.int32) * 3000  # the earlier format, counts past float16's exact range
    np.savez(kept, **state)
    restored, again = model()
    again(tf.constant([1], tf.int64), training=False)
    load_checkpoint(tmp_path / "ckpt", restored)
    sketch = again.state.sketch.numpy()
    assert sketch.dtype == np.float16 and sorted(set(sketch.tolist())) == [0, 2048]


def test_keras_weights_of_another_index_layout_are_refused_naming_it(tmp_path):
    import keras

    def model(width: int) -> keras.Model:
        table = EmbeddingTable(32, 2, eviction_policy="lru", bucket_capacity=width, name="items")
        return keras.Sequential([keras.Input((1,), dtype="int64"), table])

    saved = model(8)
    saved.layers[0](tf.constant([[5]], tf.int64), training=True)
    saved.save_weights(tmp_path / "w.weights.h5")
    other = model(4)
    before = [v.numpy().copy() for v in other.layers[0].variables]
    with pytest.raises(ValueError, match="items: these weights hold another key index layout.*bucket_capacity=4"):
        other.load_weights(tmp_path / "w.weights.h5")
    for v, b in zip(other.layers[0].variables, before):
        np.testing.assert_array_equal(v.numpy(), b)  # nothing written
    again = model(8)
    again.load_weights(tmp_path / "w.weights.h5")
    assert table_map(again.layers[0]) == table_map(saved.layers[0])


def test_wall_clock_steps_in_one_millisecond_still_tell_their_rows_apart():
    """The clock moves at least 1 ms a lookup: the next step may evict the last step's keys."""
    table = EmbeddingTable(4, 2, eviction_policy="ttl", ttl_seconds=60, bucket_capacity=4)
    step = tf.function(lambda keys: table(keys, training=True))
    for t in range(20):
        step(tf.constant([4 * t, 4 * t + 1, 4 * t + 2, 4 * t + 3], tf.int64))
        step(tf.constant([1000 + t], tf.int64))
    assert table.unplaced == 0 and 1019 in table_map(table)


def test_a_wall_clock_table_restored_without_marks_keeps_its_rows_fresh():
    table = EmbeddingTable(8, 2, eviction_policy="ttl", ttl_seconds=3600)
    table.build()
    table.restore({"keys": np.array([1, 2, 3]), "vectors": np.full((3, 2), 7.0, np.float32)})
    table(tf.constant([9], tf.int64), training=True)  # the first lookup moves the clock to the time now
    np.testing.assert_allclose(table(tf.constant([1, 2, 3], tf.int64)).numpy(), 7.0)


def test_an_lfu_table_takes_rows_by_write():
    table = EmbeddingTable(16, 2, eviction_policy="lfu")
    table.build()
    table.write(np.array([1, 2, 3]), {"vectors": np.arange(6, dtype=np.float32).reshape(3, 2)})
    np.testing.assert_array_equal(table.read([3, 1])["vectors"], [[4, 5], [0, 1]])
    assert sorted(zip(table.export()["keys"].tolist(), table.export()["counts"].tolist())) == [(1, 1), (2, 1), (3, 1)]


def _everything(table: EmbeddingTable) -> tuple:
    """What a refused call must leave as it was: the rows by key, the clock, the sketch."""
    def read(variable):
        return None if variable is None else variable.numpy().tolist()

    state = table.state
    return {k: v.tolist() for k, v in table.export().items()}, read(state.clock), read(state.sketch)


@pytest.mark.parametrize("kwargs, arrays, message", [
    ({}, {"vectors": np.full((2, 2), "a")}, r"vectors must hold real numbers"),
    ({}, {"vectors": np.full((2, 2), None)}, r"vectors must hold real numbers, got dtype object"),
    ({"eviction_policy": "lru"}, {"marks": np.array([-1, 3])}, r"marks must be integers >= 0, got int64 from -1"),
    ({"eviction_policy": "lru"}, {"marks": np.array([1.5, 2.0])}, r"marks must be integers >= 0, got float64"),
    ({"eviction_policy": "lfu"}, {"counts": np.array([-5, 3])}, r"counts must be integers >= 0"),
    # a wall clock's marks (milliseconds since 1970) into a step clock, and step marks into a wall clock
    ({"eviction_policy": "lru"}, {"marks": np.array([1_795_920_700_171] * 2)}, r"marks up to 1795920700171 .* look "
                                                                                r"like milliseconds"),
    ({"eviction_policy": "ttl", "ttl_seconds": 100.0}, {"marks": np.array([3, 4])}, r"marks from 3 .* look like steps"),
])
def test_a_refused_restore_changes_nothing(kwargs, arrays, message):
    table = EmbeddingTable(16, 2, name="t", **kwargs)
    for t in range(3):
        table(tf.constant([1, 2, 3 + t], tf.int64), training=True)
    before = _everything(table)
    saved = {"keys": np.array([7, 8]), "vectors": np.ones((2, 2), np.float32), **arrays}
    with pytest.raises(ValueError, match=message):
        table.check(saved)
    with pytest.raises(ValueError, match=message):
        table.restore(saved)
    assert _everything(table) == before


@pytest.mark.parametrize("kwargs", [{"track_changes": True}, {"min_count": 2, "sketch_width": 64},
                                    {"admit_probability": 0.999}], ids=["tracks", "min_count", "admit_probability"])
@pytest.mark.parametrize("in_graph", [False, True])
def test_a_table_that_admits_or_tracks_and_is_full_raises_before_anything_changes(kwargs, in_graph):
    """Out of rows, as a plain table: `VocabularyExhausted` (in a graph, its base class with the
    same message) before the clock ticks, a mark moves or the sketch counts the batch."""
    from sok_tutorial.embedding import VocabularyExhausted

    table = EmbeddingTable(4, 2, name="t", **kwargs)
    for _ in range(2):  # (twice: min_count=2 admits them)
        table(tf.constant([1, 2, 3], tf.int64), training=True)
    before = _everything(table)
    call = tf.function(lambda k: table(k, training=True)) if in_graph else (lambda k: table(k, training=True))
    error = tf.errors.InvalidArgumentError if in_graph else VocabularyExhausted
    too_many = tf.constant([1, 2, 5, 6, 7, 8], tf.int64)
    if "min_count" in kwargs:
        call(too_many)  # seen once: none admitted, so they fit (and are counted)
        before = _everything(table)
    with pytest.raises(error, match=r"t: vocabulary exhausted: 4 new keys in this batch, 1 rows free"):
        call(too_many)
    assert _everything(table) == before


@pytest.mark.parametrize("call, message", [
    (lambda b: lru_hit_rates([], 16), r"batches is empty"),
    (lambda b: lru_hit_rates(b, 16, skip=4), r"skip=4 is invalid: expected fewer than the 4 batches"),
    (lambda b: lru_hit_rates(b, 16, skip=-1), r"skip=-1 is invalid"),
    (lambda b: lru_hit_rates([x + 0.5 for x in b], 16), r"batches must hold integer keys"),
    (lambda b: exact_lru_hits(b, 0), r"capacity=0 is invalid"),
    (lambda b: exact_lru_hits(b, 2.5), r"capacity=2.5 is invalid"),
    (lambda b: admission_hit_rates(b, 16, skip=9), r"skip=9 is invalid"),
])
def test_hit_rates_refuse_bad_streams_by_name(call, message):
    batches = [np.arange(4 * t, 4 * t + 8) for t in range(4)]
    with pytest.raises(ValueError, match=message):
        call(batches)


@pytest.mark.parametrize("now", [3, 999, 1000, 2500])
def test_lfu_scores_in_the_epoch_of_now_are_the_words_less_one(now):
    """An LFU step whose rows were all marked in the halflife epoch of its clock (or are empty) takes
    their scores and counts from the words alone: they must equal what the epochs' arithmetic gives,
    and one row of an earlier epoch must send the step that arithmetic's way (its count halved)."""
    rng, start = np.random.default_rng(now), now // 1000 * 1000
    marks = rng.integers(start, now + 1, (8, 8))
    marks[0, :3] = -1  # empty rows
    counts = np.where(marks >= 0, rng.integers(0, 2**31 - 1, marks.shape), 0)
    clock = tf.constant(now, tf.int64)

    def check(marks: np.ndarray) -> tuple[bool, np.ndarray]:
        words = tf.constant(lfu_words.words_np(counts, marks))
        decoded = lfu_words.marks_of(words)
        halved = lfu_words.halved(words, decoded, clock, 1000)
        np.testing.assert_array_equal(decoded, marks)
        np.testing.assert_array_equal(lfu_words.decayed(words, decoded, clock, 1000), halved)
        np.testing.assert_array_equal(lfu_words.scores(words, decoded, clock, 1000), halved * 2**32 + marks)
        return bool(lfu_words.this_epoch(decoded, clock, 1000)), halved.numpy()

    current, halved = check(marks)
    assert current and halved.tolist() == counts.tolist()
    if start:
        marks[1, 1] = start - 1
        current, halved = check(marks)
        assert not current and halved[1, 1] == counts[1, 1] // 2 and halved[2, 2] == counts[2, 2]
