"""What each replica really holds: the bytes of embedding layers and their optimizer state,
device by device.

`sok_tutorial.embedding.replica_bytes` counts one replica's bytes from the variables' shapes;
`bytes_per_device` reads the copies themselves: every variable of the layers (a mirrored or
sharded variable has one copy per replica device) and the optimizer's slots for them, summed by
the device each copy lives on. A plan that says "this many bytes on every replica" is then
checked on every replica of the strategy that trained, not on one.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from sok_tutorial.embedding.ops import local_components


def bytes_per_device(layers: Sequence[Any], optimizer: Any = None) -> dict[str, int]:
    """Bytes of `layers`' variables (tables' rows, key indexes, projections) and of `optimizer`'s
    slots for them, by device, for this process's devices.

    Args:
        layers: Keras layers (embedding layers, or a model); their ``weights`` are counted.
        optimizer: a built optimizer; its variables named after a counted variable (Keras names a
            slot ``<variable path>_<slot>``) are counted on the devices of their copies. None:
            no optimizer state.

    Returns:
        ``{device: bytes}``, the devices in the order their copies are listed (replica order).

    Example:
        >>> from sok_tutorial.embedding import DistributedEmbedding
        >>> layer = DistributedEmbedding("sum", 100, 8, slot_num=1, max_nnz=1, use_hashtable=False)
        >>> layer.build()
        >>> list(bytes_per_device([layer]).values())  # 100 rows x 8 float32
        [3200]
    """
    variables = list({id(v): v for layer in layers for v in layer.weights}.values())
    if optimizer is not None and getattr(optimizer, "built", False):
        prefixes = tuple(v.path.replace("/", "_") + "_" for v in variables)
        variables += [v for v in optimizer.variables if v.name.startswith(prefixes)]
    held: dict[str, int] = {}
    for variable in variables:
        for copy in local_components(variable):
            device = tf.DeviceSpec.from_string(copy.device).to_string()
            held[device] = held.get(device, 0) + int(copy.shape.num_elements()) * copy.dtype.size
    return held
