"""Embedding layers with SOK's API on Keras 3, dynamic vocabularies and grouped lookups."""
from sok_tutorial.embedding.initializers import KeyedInitializer, keyed_initial_values
from sok_tutorial.embedding.layers import All2AllDenseEmbedding, DistributedEmbedding
from sok_tutorial.embedding.lookup import group_embedding_lookup_sparse
from sok_tutorial.embedding.sharding import (
           exchange_bytes,
           local_table_rows,
           plan_table_wise,
           replica_bytes,
           rows_per_replica,
)
from sok_tutorial.embedding.utils import OptimizerScope, split_embedding_variable_from_others
from sok_tutorial.embedding.vocabulary import DynamicVocabulary, VocabularyExhausted

__all__ = ["All2AllDenseEmbedding", "DistributedEmbedding", "DynamicVocabulary", "KeyedInitializer",
           "OptimizerScope", "VocabularyExhausted", "group_embedding_lookup_sparse", "keyed_initial_values",
           "exchange_bytes", "local_table_rows", "plan_table_wise", "replica_bytes", "rows_per_replica",
           "split_embedding_variable_from_others"]
