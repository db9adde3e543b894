"""`frequency_blocks`: a mixed-dimension layer's blocks, widths and key remapping from its ids' counts."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sok_tutorial.embedding import MixedDimensionEmbedding, frequency_order, mixed_dimensions
from sok_tutorial.embedding.mixed_dimension import frequency_blocks


def test_blocks_hold_their_fraction_of_the_ids_most_frequent_first():
    counts = np.random.default_rng(0).permutation(np.random.default_rng(1).zipf(1.5, 1000))  # a Zipf feature
    blocks = frequency_blocks(counts, [0.01, 0.09, 0.9], 16, alpha=0.3)
    assert blocks.block_sizes == [10, 90, 900]
    order, inverse = frequency_order(counts)
    np.testing.assert_array_equal(blocks.inverse, inverse)
    ranked = counts[order]
    lookups = [ranked[:10].sum(), ranked[10:100].sum(), ranked[100:].sum()]
    assert blocks.block_dims == mixed_dimensions([10, 90, 900], 16, 0.3, block_counts=lookups)
    assert blocks.block_dims[0] == 16 and blocks.block_dims[-1] < blocks.block_dims[1] < 16  # rare ids: narrow


def test_the_layer_built_from_the_blocks_looks_each_id_up_by_its_rank():
    counts = [3, 0, 7, 1, 7, 2]
    blocks = frequency_blocks(counts, [1 / 3, 2 / 3], 4, alpha=1.0)
    assert blocks.block_sizes == [2, 4] and blocks.block_dims == [4, 1]  # 14 / 2 lookups a row, then 6 / 4
    keys = blocks.inverse[[2, 4, 0, 5, 3, 1]]  # ids by decreasing count (ties by id)
    assert keys.tolist() == [0, 1, 2, 3, 4, 5]
    layer = MixedDimensionEmbedding("sum", blocks.block_sizes, 4, block_dims=blocks.block_dims)
    assert layer(tf.constant(keys[:, None])).shape == (6, 1, 4)


def test_a_block_never_looked_up_gets_the_narrowest_width():
    blocks = frequency_blocks([5] * 10 + [0] * 90, [0.1, 0.9], 8, min_dim=2)
    assert blocks.block_dims == [8, 2]


@pytest.mark.parametrize("counts, fractions, message", [
    (np.ones(10), [0.5, 0.4], r"fractions=\[0.5, 0.4\] is invalid: expected .* adding up to 1"),
    (np.ones(10), [1.0, 0.0], r"fractions=\[1.0, 0.0\] is invalid"),
    (np.ones(2), [0.2, 0.3, 0.5], r"counts has 2 ids, fewer than the 3 blocks"),
    (np.ones(10), [0.95, 0.04, 0.01], r"leave no id of 10 for the last block"),
    ([1, -1, 2], [0.5, 0.5], r"counts must be a 1-D array of non-negative counts"),
])
def test_bad_input_names_the_argument(counts, fractions, message):
    with pytest.raises(ValueError, match=message):
        frequency_blocks(counts, fractions, 8)
