"""The embedding training cache: tables larger than the device in a parameter server, paged in
per data file (HugeCTR's Embedding Training Cache on Keras)."""
from sok_tutorial._lazy import lazy_getattr

_NAMES = {
    "EmbeddingTrainingCache": "sok_tutorial.cache.training_cache",
    "KeysetRemap": "sok_tutorial.cache.training_cache",
    "IncrementalModel": "sok_tutorial.cache.exports",
    "ParameterServer": "sok_tutorial.cache.ps",
    "HostMemoryPS": "sok_tutorial.cache.ps",
    "DiskPS": "sok_tutorial.cache.disk_ps",
    "PSLocked": "sok_tutorial.cache.disk_ps",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_getattr(__name__, _NAMES)
