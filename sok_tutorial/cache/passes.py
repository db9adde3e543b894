"""`CachePasses`: `EmbeddingTrainingCache.fit` and `evaluate`, whole passes over data files, each
through the cache's core (`update`, the loader transform of `transform`, `write_back`).

A mixin of `sok_tutorial.cache.training_cache.EmbeddingTrainingCache`, which it needs for
everything but the loop over passes.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from sok_tutorial.cache.staging import keys_beside


class CachePasses:
    """Train over ``[(files, keyset), ...]`` and evaluate on files, through the cache."""

    def fit(self, passes: Sequence[tuple[Any, Any]], *, batch_size: int, label_names: Sequence[str],
            cat_names: Sequence[str], cont_names: Sequence[str] = (), key_offsets: Mapping[str, int] | None = None,
            epochs: int = 1, eval_pass: tuple[Any, Any] | None = None, callbacks: Sequence[Any] = (),
            **loader_kwargs: Any) -> list[dict[str, Any]]:
        """Train over ``[(files, keyset), ...]``: update, ``model.fit`` over the files, write back.

        ``keyset=None`` reads the keysets written beside the files. ``key_offsets`` maps each
        categorical column to its offset in the global key space (default: 0). With `eval_pass`,
        ``model.evaluate`` runs on it after every pass; without it, each pass's rows are
        prefetched while the pass before trains. Returns one record per pass.
        """
        from sok_tutorial.data import ParquetLoader

        offsets = {c: 0 for c in cat_names} | dict(key_offsets or {})
        keysets = [keyset if keyset is not None else keys_beside(files) for files, keyset in passes]
        records = []
        for i, (files, _) in enumerate(passes):
            self.update(keysets[i])
            if i + 1 < len(passes) and eval_pass is None:  # an evaluation pass in between would drop it
                self.prefetch(keysets[i + 1])
            loader = ParquetLoader(files, batch_size, label_names, cat_names=cat_names, cont_names=cont_names,
                                   transforms=[self.transform(offsets)], **loader_kwargs)
            start = time.perf_counter()
            logs = self.model.fit(loader, epochs=epochs, verbose=0, callbacks=list(callbacks)).history
            train_s = time.perf_counter() - start
            self.write_back()
            record = {**self.history[-1], "train_s": train_s, "loss": logs["loss"][-1],
                      "samples": loader.core.num_rows * epochs}
            if eval_pass is not None:
                record.update({f"eval_{k}": v for k, v in self.evaluate(*eval_pass, batch_size=batch_size,
                              label_names=label_names, cat_names=cat_names, cont_names=cont_names,
                              key_offsets=offsets, **loader_kwargs).items()})
            self.history[-1].update(record)
            records.append(record)
        return records

    def evaluate(self, files: Any, keyset: Any = None, *, batch_size: int, label_names: Sequence[str],
                 cat_names: Sequence[str], cont_names: Sequence[str] = (), key_offsets: Mapping[str, int] | None = None,
                 **loader_kwargs: Any) -> dict[str, float]:
        """``model.evaluate`` on `files` with the rows of their keyset; nothing is written back."""
        from sok_tutorial.data import ParquetLoader

        offsets = {c: 0 for c in cat_names} | dict(key_offsets or {})
        self.update(keyset if keyset is not None else keys_beside(files))
        try:
            loader = ParquetLoader(files, batch_size, label_names, cat_names=cat_names, cont_names=cont_names,
                                   transforms=[self.transform(offsets)], **{**loader_kwargs, "shuffle": False})
            return {k: float(v) for k, v in self.model.evaluate(loader, verbose=0, return_dict=True).items()}
        finally:
            self.discard()
