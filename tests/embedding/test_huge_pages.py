"""Large tables on 2 MB pages (`sok_tutorial.embedding.huge_pages`): what is advised, when, and
that nothing else changes."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sok_tutorial import optimizers
from sok_tutorial.embedding import EmbeddingTable, huge_pages
from sok_tutorial.embedding.ops import tf_variable


def huge_bytes_at(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (``/proc/self/smaps``), in bytes."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            field = line.split()
            if "-" in field[0] and ":" not in field[0]:
                low, high = (int(x, 16) for x in field[0].split("-"))
                inside = low <= address < high
            elif inside and field[0] == "AnonHugePages:":
                return int(field[1]) << 10
    return 0


def collapses() -> bool:
    """Whether this machine moves a fresh 8 MiB buffer onto huge pages (a kernel of 6.1 or later,
    transparent huge pages not ``never``, and huge pages to be had)."""
    probe = tf.Variable(tf.zeros([1 << 21], tf.float32))
    return huge_pages.advise([probe], min_bytes=0) > 0


needs_huge_pages = pytest.mark.skipif(not huge_pages.enabled() or not collapses(),
                                      reason="this kernel or its settings give no transparent huge pages")


@needs_huge_pages
def test_a_large_variable_moves_onto_huge_pages_once_with_its_values_unchanged():
    values = np.random.default_rng(0).standard_normal((1 << 21, 8)).astype(np.float32)  # 64 MiB
    variable = tf.Variable(values)
    address, size = huge_pages._host_buffer(variable)
    middle = address + size // 2
    assert huge_bytes_at(middle) == 0
    moved = huge_pages.advise([variable])
    # every whole 2 MB page inside the buffer, and nothing outside it
    assert size - 2 * huge_pages.HUGE < moved <= size
    assert huge_bytes_at(middle) > 0
    assert huge_pages.advise([variable]) == 0  # once
    np.testing.assert_array_equal(variable.numpy(), values)
    rows = tf.constant([3, 70_000, (1 << 21) - 1])
    variable.scatter_update(tf.IndexedSlices(tf.ones([3, 8]), rows))  # in place: the buffer stays
    np.testing.assert_array_equal(tf.gather(variable, rows).numpy(), np.ones((3, 8), np.float32))
    assert huge_bytes_at(middle) > 0


def test_small_variables_and_a_switched_off_process_are_left_alone(monkeypatch):
    small = tf.Variable(tf.zeros([1 << 10, 4]))
    assert huge_pages.advise([small]) == 0
    assert not getattr(small, huge_pages._ADVISED, False)  # below the size: not even looked at
    monkeypatch.setenv("SOK_TUTORIAL_HUGE_PAGES", "0")
    assert not huge_pages.enabled()
    large = tf.Variable(tf.zeros([1 << 22, 4]))
    assert huge_pages.advise([large], min_bytes=0) == 0
    assert not getattr(large, huge_pages._ADVISED, False)


@needs_huge_pages
def test_a_table_advises_its_variables_at_its_first_lookup_and_the_optimizer_its_slots(monkeypatch):
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 1 << 20)  # a small table stands in for a large one
    table = EmbeddingTable(1 << 15, 16)  # 2 MiB of rows (advised), its index under 1 MiB (not)
    keys = tf.constant(np.arange(1000, dtype=np.int64) * 7919)
    tf.function(lambda k: table.lookup(k, training=True))(keys)  # first looked up while a step is traced
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(table.lookup(keys, training=True) ** 2)
    for weight in table.weights:  # the rows, and whatever else is 1 MiB or more
        size = weight.shape.num_elements() * tf.as_dtype(weight.dtype).size
        assert getattr(tf_variable(weight), huge_pages._ADVISED, False) == (size >= 1 << 20), weight.name
    optimizer = optimizers.LazyAdam(0.01)
    optimizer.apply(tape.gradient(loss, [table.variable]), [table.variable])
    slots = table.optimizer_slots(optimizer)
    assert slots and all(getattr(tf_variable(s), huge_pages._ADVISED, False) for s in slots)
    assert float(tf.reduce_sum(table.lookup(keys) ** 2)) < float(loss)  # and it trains as before
