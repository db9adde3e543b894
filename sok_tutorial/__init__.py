"""sok_tutorial: huge-embedding recommender training on TensorFlow 2 / Keras 3, on any machine.

Public names follow the systems users come from (SOK, NVTabular, HugeCTR). They resolve lazily:
``import sok_tutorial`` is instant, and TensorFlow loads only when a TF-facing name is first used.
"""
from sok_tutorial._lazy import lazy_getattr

__version__ = "0.1.0"

_NAMES: dict[str, str] = {}
__all__ = ["__version__", *sorted(_NAMES)]
__getattr__ = lazy_getattr(__name__, _NAMES)
