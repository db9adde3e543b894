"""Data preparation and loading: the dataset convention, parquet conversion, categorify,
keysets. Names resolve lazily; nothing here imports TensorFlow until a loader is used."""
from sok_tutorial._lazy import lazy_getattr

_NAMES = {
    "ColumnSchema": "sok_tutorial.data.schema",
    "Schema": "sok_tutorial.data.schema",
    "resolve_files": "sok_tutorial.data.schema",
    "read_file_list": "sok_tutorial.data.schema",
    "DatasetWriter": "sok_tutorial.data.writer",
    "PartWriter": "sok_tutorial.data.writer",
    "read_keyset": "sok_tutorial.data.keyset",
    "write_keyset": "sok_tutorial.data.keyset",
    "keyset_path": "sok_tutorial.data.keyset",
    "Categorify": "sok_tutorial.data.categorify",
    "get_embedding_sizes": "sok_tutorial.data.categorify",
    "to_parquet_dataset": "sok_tutorial.data.convert",
    "convert_files": "sok_tutorial.data.convert",
    "ParquetLoader": "sok_tutorial.data.loader",
    "LoaderError": "sok_tutorial.data.loader_base",
    "HashBucket": "sok_tutorial.data.transforms",
    "Workflow": "sok_tutorial.data.workflow",
    "split_rows": "sok_tutorial.data.workflow",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_getattr(__name__, _NAMES)


def __dir__() -> list[str]:
    return __all__
