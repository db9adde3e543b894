"""What a traced step's graph holds: the op types of a graph and of the functions it calls."""
from __future__ import annotations

import tensorflow as tf


def op_types(graph: tf.Graph) -> list[str]:
    """The type of every op in `graph` and in its functions (branches and loop bodies)."""
    ops = [op.type for op in graph.get_operations()]
    for function in graph._functions.values():
        ops += [node.op for node in function.definition.node_def]
    return ops


def collectives(graph: tf.Graph) -> int:
    """How many collective ops `graph` and its functions hold."""
    return sum(op.startswith("Collective") for op in op_types(graph))
