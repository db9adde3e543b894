"""The small model the sharding tests train: one `DistributedEmbedding` of 3 slots (width
`DIM`) under a Dense layer, and its data, with keys repeated within and across replicas."""
from __future__ import annotations

import keras
import numpy as np

import sok_tutorial as sok
from sok_tutorial.embedding import grid_shape

DIM = 5  # slices 3 + 2 on 2 replicas (or a 2 x 2 grid), 2 + 1 + 1 + 1 on 4
ROWS = 400  # one device; a row-wise shard or a grid's row group holds ROWS / (its row groups)


def small_model(strategy, sharding: str, dynamic: bool = True, optimizer: str = "adam", **kwargs) -> tuple:
    """(model, layer, optimizer), built and compiled under `strategy`; `kwargs` go to the layer."""
    keras.utils.set_random_seed(0)
    n = strategy.num_replicas_in_sync
    groups = {"row": n, "row_column": grid_shape(n, DIM, kwargs.get("column_shards"))[0]}.get(sharding, 1)
    with strategy.scope():
        inp = keras.Input([3], dtype="int64")
        layer = sok.DistributedEmbedding("sum", ROWS // groups, DIM, slot_num=3, max_nnz=1, sharding=sharding,
                                         name="emb", use_hashtable=dynamic, **kwargs)
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Reshape([3 * DIM])(layer(inp)))
        model = keras.Model(inp, out, name="m")
        opt = {"adam": lambda: sok.optimizers.Adam(0.05), "lazyadam": lambda: sok.optimizers.LazyAdam(0.05),
               "sgd": lambda: sok.optimizers.SGD(0.5)}[optimizer]()
        model.compile(opt, "binary_crossentropy")
        opt.build(model.trainable_variables)
    return model, layer, opt


def small_data(dynamic: bool) -> tuple[np.ndarray, np.ndarray]:
    """128 rows of 3 keys (row ids below ROWS for a static table) and their labels."""
    rng = np.random.default_rng(4)
    x = rng.integers(-10**12, 10**12, (128, 3)) % (ROWS if not dynamic else 10**12)
    x[::3] = x[1::3][:len(x[::3])]  # repeated keys, also across replicas
    return x, (x[:, :1] % 3 == 0).astype("float32")
