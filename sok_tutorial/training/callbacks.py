"""Keras callbacks for recommender training, usable in ``model.fit`` and in `fit`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from kernels import checks


class ThroughputLogger(keras.callbacks.Callback):
    """Samples per second over windows of `every` steps, printed and logged to TensorBoard.

    Works in ``model.fit`` (also with ``steps_per_execution > 1``: Keras then reports every
    n-th step, and the batch index says how many ran) and in `sok_tutorial.training.fit`.

    Args:
        batch_size: samples per step (used when the logs carry no ``size``).
        every: steps per measurement window.
        log_dir: where to write the ``samples_per_s`` scalar (a TensorBoard run directory).
        warmup: steps left out at the start (graph tracing, caches warming up).
        verbose: print each window's rate.

    ``history`` holds ``(step, samples_per_s)`` per window; ``rate()`` is samples over seconds of
    everything after the warm-up (the figure to report), ``mean()`` the mean of the windows.

    Example:
        >>> import numpy as np
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> model.compile("sgd", "mse")
        >>> logger = ThroughputLogger(batch_size=32, every=4, warmup=2)
        >>> _ = model.fit(np.ones((640, 4)), np.ones((640, 1)), batch_size=32, callbacks=[logger], verbose=0)
        >>> [step for step, _ in logger.history], logger.rate() > 0
        ([6, 10, 14, 18], True)
    """

    def __init__(self, batch_size: int, every: int = 20, log_dir: str | Path | None = None, warmup: int = 2,
                 verbose: bool = False):
        super().__init__()
        self.batch_size = checks.positive_int("batch_size", batch_size)
        self.every = checks.positive_int("every", every)
        self.warmup = checks.positive_int("warmup", warmup, allow_zero=True)
        self.verbose = verbose
        self.log_dir = log_dir
        self.writer = tf.summary.create_file_writer(str(log_dir)) if log_dir is not None else None
        self.history: list[tuple[int, float]] = []
        self._step = 0
        self._last_index = -1
        self._origin = 0
        self._start: float | None = None
        self._first: float | None = None
        self._samples = 0
        self._total_samples = 0
        self._end: float | None = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._last_index = -1

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.warmup == 0:
            self._first = self._start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        steps = batch - self._last_index if batch > self._last_index else 1
        self._last_index = batch
        self._step += steps
        now = time.perf_counter()
        if self._first is None:  # timing starts at the first report at or past the warm-up
            if self._step >= self.warmup:
                self._first = self._start = now
                self._origin = self._step
            return
        size = int((logs or {}).get("size", self.batch_size))
        self._samples += steps * size
        self._total_samples += steps * size
        self._end = now
        if self._step - self._origin >= self.every:
            rate = self._samples / max(now - self._start, 1e-9)
            self.history.append((self._step, rate))
            if self.writer is not None:
                with self.writer.as_default():
                    tf.summary.scalar("samples_per_s", rate, step=self._step)
            if self.verbose:
                print(f"step {self._step}: {rate:,.0f} samples/s")
            self._start, self._samples, self._origin = now, 0, self._step

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.writer is not None:
            self.writer.flush()

    def rate(self) -> float:
        """Samples per second over all steps after the warm-up (NaN before any)."""
        if self._first is None or self._end is None or self._end <= self._first:
            return float("nan")
        return self._total_samples / (self._end - self._first)

    def mean(self) -> float:
        """Mean of the windows' rates (NaN before the first window)."""
        return sum(r for _, r in self.history) / len(self.history) if self.history else float("nan")
