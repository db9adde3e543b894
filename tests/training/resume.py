"""The resume check both fit tests share: one run straight through, one stopped at a snapshot and
resumed by a fresh model, as a new process would."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from sok_tutorial.training import fit


def straight_and_resumed(tmp_path: Path, make_model: Callable[[], Any], make_loaders: Callable[[], tuple],
                         stop: int, *, evaluate: bool = False, **fit_kwargs: Any) -> list[tuple]:
    """``[(first, history, weights, model)]`` for the straight run (``first`` None) and the run
    stopped after `stop` steps (``first``: the history up to the snapshot), same seed and data."""
    runs = []
    for interrupted in (False, True):
        keras.utils.set_random_seed(0)
        train, valid = make_loaders()
        model = make_model()
        snaps, first = tmp_path / f"snaps-{interrupted}", None
        if interrupted:
            first = fit(model, train, max_steps=stop, snapshot_interval=stop, snapshot_dir=snaps, progress=False,
                        verbose=False)
            keras.utils.set_random_seed(123)  # a fresh process: nothing carried over but the snapshot
            train, valid = make_loaders()
            model = make_model()
        history = fit(model, train, eval_loader=valid if evaluate else None, snapshot_dir=snaps, progress=False,
                      verbose=False, **fit_kwargs)
        runs.append((first, history, [v.numpy() for v in model.trainable_variables], model))
    return runs
