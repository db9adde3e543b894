"""Rows looked up ahead, in the input pipeline: `EmbeddingTable`'s side of
`sok_tutorial.embedding.lookup_ahead`.

`RowsAhead` is a mixin of `sok_tutorial.embedding.table.EmbeddingTable`; it works through the
table's key index (`index_variables`), its `rows` and its lifecycle. The pipeline calls
`rows_ahead` on the next batch's distinct keys while the step trains; the step's lookup hands the
rows it finds in `UniqueKeys.rows` to `_rows_checked`, which keeps only the ones still right.
"""
from __future__ import annotations

import tensorflow as tf

from sok_tutorial.embedding import index as key_index
from sok_tutorial.embedding.ops import local_components, read_rows, updated
from sok_tutorial.embedding.unique_keys import UniqueKeys

_AHEAD_SAMPLE = 1024  # keys `rows_ahead` looks up first, to see whether nearly all have rows


class RowsAhead:
    """A dynamic table's rows found by the input pipeline, and the step's check of them."""

    @property
    def takes_rows_ahead(self) -> bool:
        """Whether rows looked up in the input pipeline (`rows_ahead`) can spare this table its index
        lookups: a built dynamic table held whole by one copy, without a policy, admission or change
        tracking (whose rows never move while it trains)."""
        return self.built and self.indexed and not self.lifecycle.active and \
            len(local_components(self._slots)) == 1

    def rows_ahead(self, ready: UniqueKeys) -> UniqueKeys:
        """`ready` with the rows this table's index holds for its distinct keys now (-1: none), read
        only: for the input pipeline (`sok_tutorial.embedding.lookup_ahead`), ahead of the step. A
        table that cannot use them (`takes_rows_ahead`) gets `ready` back as it was."""
        if not self.takes_rows_ahead:
            return ready
        index, unique = self.index_variables(), ready.unique
        # While many keys are new (a table filling up), rows found ahead save little, and reading the
        # index then makes the step's writes to it wait: only if 9 in 10 of a sample have rows (else -1s).
        sample, _ = key_index.lookup(index, unique[:_AHEAD_SAMPLE])
        known = 10 * tf.math.count_nonzero(sample >= 0) >= 9 * tf.size(sample, tf.int64)
        rows = tf.cond(known & (tf.size(unique) > 0), lambda: key_index.lookup(index, unique)[0],
                       lambda: tf.fill(tf.shape(unique), tf.constant(-1, tf.int64)))
        return UniqueKeys(unique, ready.position, ready.pairs, rows)

    def _rows_checked(self, keys: tf.Tensor, hints: tf.Tensor, insert: bool) -> tuple[tf.Tensor, tf.Tensor | None]:
        """`rows` of the distinct `keys` given the rows found for them ahead (`hints`, -1: none). A
        hint stands when its row is in use and holds its key (rows in use hold one key each, so
        the key's row it is, even if the table was restored since); the other keys, new ones among
        them, go through the index as usual. Once a table knows its keys, that is one gather."""
        index = self.index_variables()

        def rows_of(keys: tf.Tensor) -> tf.Tensor:  # (-1: none)
            rows, found = self.rows(keys, insert=insert)
            return rows if found is None else tf.where(found, rows, -1)

        def checked() -> tf.Tensor:
            at = tf.clip_by_value(hints, 0, self.capacity - 1)
            good = (hints >= 0) & (hints < index.size.read_value()) & tf.equal(read_rows(index.row_keys, at), keys)

            def the_others() -> tf.Tensor:
                others = tf.where(~good)[:, 0]
                return updated(hints, others, rows_of(tf.gather(keys, others)))

            return tf.cond(tf.reduce_all(good), lambda: tf.identity(hints), the_others)

        rows = tf.cond(tf.reduce_any(hints >= 0), checked, lambda: rows_of(keys))  # (no hints: as without)
        return (rows, None) if insert else (tf.maximum(rows, 0), rows >= 0)
