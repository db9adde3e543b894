"""sok_tutorial: huge-embedding recommender training on TensorFlow 2 / Keras 3, on any machine.

Public names follow the systems users come from (SOK, NVTabular, HugeCTR; Keras-RS's configuration
through `from_keras_rs`). They resolve lazily:
``import sok_tutorial`` is instant, and TensorFlow loads only when a TF-facing name is first used.
"""
from sok_tutorial._lazy import lazy_getattr

__version__ = "0.1.0"

_NAMES: dict[str, str] = {
    "DistributedEmbedding": "sok_tutorial.embedding",
    "All2AllDenseEmbedding": "sok_tutorial.embedding",
    "EmbeddingTable": "sok_tutorial.embedding",
    "ShardedTable": "sok_tutorial.embedding",
    "tables_of": "sok_tutorial.embedding",
    "split_embedding_variable_from_others": "sok_tutorial.embedding",
    "OptimizerScope": "sok_tutorial.embedding",
    "group_embedding_lookup_sparse": "sok_tutorial.embedding",
    "from_keras_rs": "sok_tutorial.embedding",
    "unique_keys": "sok_tutorial.embedding",
    "lookup_ahead": "sok_tutorial.embedding",
    "UniqueKeys": "sok_tutorial.embedding",
    "Init": "sok_tutorial.distribute",
    "replica_devices": "sok_tutorial.distribute",
    "make_strategy": "sok_tutorial.distribute",
    "resolve_device": "sok_tutorial.distribute",
    "cpu_threads": "sok_tutorial.distribute",
    "use_onednn": "sok_tutorial.onednn",
    "onednn_enabled": "sok_tutorial.onednn",
    "rows_per_replica": "sok_tutorial.embedding",
    "plan_table_wise": "sok_tutorial.embedding",
    "column_slices": "sok_tutorial.embedding",
    "grid_shape": "sok_tutorial.embedding",
    "SOKDenseDemo": "sok_tutorial.models",
    "optimizers": "sok_tutorial.optimizers",
    "models": "sok_tutorial.models",
    "training": "sok_tutorial.training",
    "embedding": "sok_tutorial.embedding",
    "data": "sok_tutorial.data",
}
__all__ = ["__version__", *sorted(_NAMES)]
__getattr__ = lazy_getattr(__name__, _NAMES)
