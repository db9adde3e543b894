"""Embedding tables (`EmbeddingTable`, the unit; `ShardedTable` over replicas), the Keras layers
with SOK's API on top of them, their memory-saving variants (`QREmbedding`,
`MixedDimensionEmbedding`), grouped lookups, `plan`, which places every table within a
per-replica memory budget, and `from_keras_rs`, which builds a `FeatureEmbedding` of such tables
from Keras-RS's configuration."""
from sok_tutorial.embedding.compositional import QREmbedding
from sok_tutorial.embedding.device_bytes import bytes_per_device
from sok_tutorial.embedding.features import FeatureEmbedding
from sok_tutorial.embedding.index import VocabularyExhausted
from sok_tutorial.embedding.initializers import KeyedInitializer, keyed_initial_values
from sok_tutorial.embedding.keras_rs import from_keras_rs
from sok_tutorial.embedding.layers import All2AllDenseEmbedding, DistributedEmbedding
from sok_tutorial.embedding.lookup import group_embedding_lookup_sparse
from sok_tutorial.embedding.mixed_dimension import (
           MixedDimensionEmbedding,
           frequency_blocks,
           frequency_order,
           mixed_dimensions,
)
from sok_tutorial.embedding.ops import UniqueRowsGradient
from sok_tutorial.embedding.placement import (
           column_slices,
           exchange_bytes,
           grid_shape,
           plan_table_wise,
           replica_bytes,
           rows_per_replica,
)
from sok_tutorial.embedding.planner import Plan, PlanError, TableSpec, plan
from sok_tutorial.embedding.sharding import ShardedTable
from sok_tutorial.embedding.table import EmbeddingTable, table_of, tables_of
from sok_tutorial.embedding.unique_keys import UniqueKeys, lookup_ahead, unique_keys
from sok_tutorial.embedding.utils import OptimizerScope, split_embedding_variable_from_others

__all__ = ["All2AllDenseEmbedding", "bytes_per_device", "column_slices", "DistributedEmbedding", "EmbeddingTable",
           "exchange_bytes", "FeatureEmbedding", "frequency_blocks", "frequency_order", "from_keras_rs", "grid_shape",
           "group_embedding_lookup_sparse", "keyed_initial_values", "KeyedInitializer", "lookup_ahead",
           "mixed_dimensions", "MixedDimensionEmbedding", "OptimizerScope", "Plan", "plan", "plan_table_wise",
           "PlanError", "QREmbedding", "replica_bytes", "rows_per_replica", "ShardedTable",
           "split_embedding_variable_from_others", "table_of", "tables_of", "TableSpec", "UniqueKeys", "unique_keys",
           "UniqueRowsGradient", "VocabularyExhausted"]
