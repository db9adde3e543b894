"""Models built from the library's layers: the SOK dense demo, EmbeddingMLP, DLRM (and TablesDLRM, over
tables made outside it), wide & deep, the three-table model of the model-parallel notebook, and the
logistic regression that baselines are made of."""
from sok_tutorial._lazy import lazy_getattr

_NAMES = {"SOKDenseDemo": "sok_tutorial.models.sok_dense_demo", "DLRM": "sok_tutorial.models.dlrm",
          "EmbeddingMLP": "sok_tutorial.models.embedding_mlp", "WideAndDeep": "sok_tutorial.models.wide_deep",
          "LogisticRegression": "sok_tutorial.models.logistic", "TablesDLRM": "sok_tutorial.models.tables_dlrm",
          "ClickTablesModel": "sok_tutorial.models.click_tables"}
__all__ = sorted(_NAMES)
__getattr__ = lazy_getattr(__name__, _NAMES)
