"""Low-precision tables: rows stored in float16 or bfloat16, computed on in float32.

``EmbeddingTable(..., storage_dtype="bfloat16")`` keeps its variable ``[capacity, dim]`` in
two bytes a value instead of four, as TorchRec's ``EmbeddingBagConfig(data_type=...)`` does.
(The argument is not called ``dtype``: a Keras layer's ``dtype`` is its dtype policy, whose
variable and compute types a table must keep apart.) Everything outside the variable stays in
float32::

    lookup     rows (storage) --gather--> cast to float32 --> the layer's float32 vectors
    gradient   float32, to the sparse optimizers (`sok_tutorial.embedding.optimizers.base`)
    update     gather rows and slots, cast up (`widen`) -> Keras' maths in float32
               -> round to the storage type (`narrow`) -> write back

Rounding is to nearest (ties to even, ``tf.cast``) or, with ``stochastic_rounding=True``, up
or down with probabilities proportional to the distances, so that it is unbiased on average:
an update smaller than half a unit in the last place still moves a row in expectation, where
round-to-nearest loses it every time. The method adds uniform noise below the last kept
mantissa bit, then truncates:

* bfloat16 is the upper 16 bits of float32: add a random 16-bit integer to the float32's bit
  pattern (sign and magnitude, so it grows the magnitude), clear the low 16 bits;
* float16: with ``ulp`` the float16 spacing at the value's exponent (``2**-24`` below float16's
  normal range), ``sign(x) * floor(|x| / ulp + u) * ulp`` with ``u`` in ``[0, 1)`` on a grid of
  ``2**-13`` (the fraction bits a float32 has beyond float16's).

The noise is a pure function of (table seed, variable, optimizer step, row, column), hashed as
the key-seeded initializer hashes keys (`sok_tutorial.embedding.initializers`), so a run
rounds identically whatever the batch order or the replica count.

Optimizer slots (Adam's moments, accumulators) are float32 by default; ``slot_dtype="storage"``
keeps them in the table's type too, rounded the same way. (A per-row step count, `LazyAdam`'s,
counts exactly only to 256 in bfloat16 and 2048 in float16.)

Keras' own (dense) optimizers, given such a table, compute in its type, as Keras does for any
variable: they cast their hyperparameters to it, and in bfloat16 Adam's ``beta_2 = 0.999``
rounds to 1.0, so its steps are zero (in float16 they overshoot Adam's bound by orders of
magnitude). So such a pairing is refused: the table's variable carries a `DenseOptimizerGuard`
constraint, which a Keras optimizer applies after its update and which raises (under
``tf.function`` and ``model.fit``, while the step is traced: before any update runs); the
optimizers of `sok_tutorial.optimizers`, which compute in float32, lift it while they apply
(`sparse_update`).

Export, checkpoints and the training cache see float32 rows (`EmbeddingTable.export`); float16
and bfloat16 values are exact in float32, so a restore gives back the stored bits.

Example:
    >>> p = Precision.create("items", "bfloat16")
    >>> p.storage, p.slot, p.low
    ('bfloat16', 'float32', True)
    >>> float(narrow(tf.constant([1.0 + 2**-9]), tf.bfloat16)[0])  # below half a bf16 ulp: lost
    1.0
"""
from __future__ import annotations

import contextlib
import weakref
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sok_tutorial.embedding.initializers import _GOLDEN, _mix64_tf, _multipliers, _salt

STORAGE_DTYPES = ("float32", "float16", "bfloat16")
SLOT_DTYPES = ("float32", "storage")
OPTIONS = ("storage_dtype", "stochastic_rounding", "slot_dtype")  # what the SOK layers forward to their table
_LOW = (tf.float16, tf.bfloat16)


@dataclass(frozen=True)
class Precision:
    """How a table stores its rows and its optimizer slots, and how updates are rounded."""

    storage: str = "float32"
    stochastic_rounding: bool = False
    slot_option: str = "float32"

    @classmethod
    def create(cls, table: str, storage_dtype: Any = "float32", stochastic_rounding: bool = False,
               slot_dtype: Any = "float32") -> Precision:
        """Check the options (ValueError naming the table, the argument, the value, the choices)."""
        storage = _name(storage_dtype)
        if storage not in STORAGE_DTYPES:
            raise ValueError(f"{table}: storage_dtype={storage_dtype!r} is invalid: expected one of "
                             f"{', '.join(STORAGE_DTYPES)}")
        slot = _name(slot_dtype) if slot_dtype is not None else "float32"
        if slot == storage:
            slot = "storage"
        if slot not in SLOT_DTYPES:
            raise ValueError(f"{table}: slot_dtype={slot_dtype!r} is invalid: expected one of "
                             f"{', '.join(SLOT_DTYPES)} (the table's storage_dtype)")
        if not isinstance(stochastic_rounding, (bool, np.bool_)):
            raise ValueError(f"{table}: stochastic_rounding={stochastic_rounding!r} is invalid: expected True or False")
        return cls(storage, bool(stochastic_rounding), slot)

    @property
    def low(self) -> bool:
        """Whether rows are stored below float32."""
        return self.storage != "float32"

    @property
    def slot(self) -> str:
        """The dtype of the optimizer's per-row slots."""
        return self.storage if self.slot_option == "storage" else "float32"

    @property
    def row_bytes(self) -> int:
        """Bytes a stored value takes."""
        return tf.as_dtype(self.storage).size

    def config(self) -> dict[str, Any]:
        return {"storage_dtype": self.storage, "stochastic_rounding": self.stochastic_rounding,
                "slot_dtype": self.slot_option}


def _name(dtype: Any) -> Any:
    try:
        return tf.as_dtype(dtype).name
    except (TypeError, ValueError):
        return dtype


def widen(values: tf.Tensor) -> tf.Tensor:
    """`values` in float32 when stored in float16 or bfloat16 (exact), else unchanged."""
    return tf.cast(values, tf.float32) if values.dtype in _LOW else values


def compute_dtype(dtype: Any) -> tf.DType:
    """The dtype updates of a variable of `dtype` are computed in: float32 for a low-precision one."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype in _LOW else dtype


def noise_bits(rows: tf.Tensor, width: int, seed: int, stream: int, step: Any, bits: int) -> tf.Tensor:
    """Random integers in ``[0, 2**bits)``, ``[len(rows), width]`` int32: a hash of (seed, stream,
    step, row, column), as `sok_tutorial.embedding.initializers` hashes a key's initial values."""
    mixed_step = _mix64_tf(tf.cast(step, tf.uint64) * tf.constant(np.uint64(_GOLDEN))
                           + tf.constant(_salt(seed, stream)))
    base = _mix64_tf(tf.bitwise.bitwise_xor(tf.bitcast(tf.cast(rows, tf.int64), tf.uint64), mixed_step))
    out = tf.bitwise.right_shift(base[:, None] * tf.constant(_multipliers(width))[None, :],
                                 tf.constant(64 - bits, tf.uint64))
    return tf.cast(out, tf.int32)


def stochastic_round(values: tf.Tensor, dtype: Any, noise: tf.Tensor) -> tf.Tensor:
    """float32 `values` rounded to `dtype` (bfloat16 or float16) stochastically; `noise`: int32 of
    the same shape, 16 random bits (bfloat16) or 13 (float16), see `noise_bits`."""
    dtype = tf.as_dtype(dtype)
    bits = tf.bitcast(values, tf.int32)
    if dtype == tf.bfloat16:
        kept = tf.bitwise.bitwise_and(bits + noise, tf.constant(-(1 << 16), tf.int32))  # clear the low 16 bits
        return tf.cast(tf.bitcast(kept, tf.float32), tf.bfloat16)  # exact
    exponent = tf.maximum(tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 23), 0xFF) - 127, -14)
    ulp = tf.bitcast(tf.bitwise.left_shift(exponent - 10 + 127, 23), tf.float32)  # 2**(e - 10) >= 2**-24
    u = tf.cast(noise, tf.float32) * (2.0 ** -13)
    magnitude = tf.floor(tf.abs(values) / ulp + u) * ulp
    return tf.cast(tf.where(values < 0, -magnitude, magnitude), tf.float16)


def narrow(values: tf.Tensor, dtype: Any, rows: tf.Tensor | None = None, *, stochastic: bool = False,
           seed: int = 0, stream: int = 0, step: Any = 0) -> tf.Tensor:
    """float32 rows `values` ``[U, ...]`` (of table rows `rows`) in `dtype`: to nearest (``tf.cast``),
    or stochastically with noise drawn for (`seed`, `stream`, `step`, row, column)."""
    dtype = tf.as_dtype(dtype)
    if not stochastic or dtype not in _LOW:
        return tf.cast(values, dtype)
    values = tf.cast(values, tf.float32)
    flat = tf.reshape(values, tf.stack([tf.shape(values)[0], -1]))  # (U, width)
    width = int(np.prod(values.shape[1:]))
    noise = noise_bits(rows, width, seed, stream, step, 16 if dtype == tf.bfloat16 else 13)
    return tf.reshape(stochastic_round(flat, dtype, noise), tf.shape(values))


# ------------------------------------------------------------------ which table rounds a slot
_SLOT_OF = "_sok_tutorial_slot_of"  # set on a slot's variable objects: (weak reference to the table, stream)


def own_slot(table: Any, slot: Any) -> None:
    """Record on optimizer variable `slot` (and the variables behind it) that it holds rows of
    `table`, so it is rounded as the table is; a new variable never inherits the record."""
    stream = zlib.crc32(slot.name.encode()) & 0xFFFF | 0x10000  # 0: the table's own rows
    for v in (slot, getattr(slot, "value", slot), *list(getattr(getattr(slot, "value", slot), "values", None) or [])):
        setattr(v, _SLOT_OF, (weakref.ref(table), stream))


def slot_owner(variable: Any) -> tuple[Any, int]:
    """(the table whose rows optimizer variable `variable` holds, its noise stream), or (None, 0)."""
    owner = getattr(variable, _SLOT_OF, None)
    table = owner[0]() if isinstance(owner, tuple) else None
    return (table, owner[1]) if table is not None else (None, 0)


class DenseOptimizerGuard(keras.constraints.Constraint):
    """The constraint of a float16 or bfloat16 table's variable: an optimizer that reaches it is a
    Keras dense optimizer, whose update of such rows is wrong (module docstring), so it raises."""

    def __init__(self, table: str, storage: str):
        self.table, self.storage = table, storage

    def __call__(self, w: Any) -> Any:
        raise ValueError(f"{self.table}: a {self.storage} table is being trained by a Keras optimizer, which "
                         f"updates it in {self.storage} (bfloat16: steps lost to rounding; float16: far too large); "
                         "use the optimizer of the same name in sok_tutorial.optimizers (e.g. "
                         "sok_tutorial.optimizers.Adam), which updates in float32 and rounds once")


@contextlib.contextmanager
def sparse_update(variables: Iterable[Any]) -> Iterator[None]:
    """Lift the `DenseOptimizerGuard` of `variables` while a sparse optimizer applies (it also spares
    Keras' after-update constraint pass a write of the whole table)."""
    guarded = [v for v in variables if isinstance(getattr(v, "constraint", None), DenseOptimizerGuard)]
    guards = [v.constraint for v in guarded]
    for v in guarded:
        v.constraint = None
    try:
        yield
    finally:
        for v, guard in zip(guarded, guards):
            v.constraint = guard
