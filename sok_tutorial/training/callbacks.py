"""Keras callbacks for recommender training, usable in ``model.fit`` and in `fit`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf


class ThroughputLogger(keras.callbacks.Callback):
    """Samples per second over windows of `every` steps, printed and logged to TensorBoard.

    Args:
        batch_size: samples per step (used when the logs carry no ``size``).
        every: steps per measurement window.
        log_dir: where to write the ``throughput`` scalar (a TensorBoard run directory).
        warmup: steps ignored at the start (graph tracing, caches warming up).

    ``self.history`` holds ``(step, samples_per_s)`` pairs; ``mean()`` is the average after warm-up.
    """

    def __init__(self, batch_size: int, every: int = 20, log_dir: str | Path | None = None, warmup: int = 2,
                 verbose: bool = False):
        super().__init__()
        self.batch_size, self.every, self.warmup, self.verbose = batch_size, every, warmup, verbose
        self.writer = tf.summary.create_file_writer(str(log_dir)) if log_dir is not None else None
        self.history: list[tuple[int, float]] = []
        self._step = 0
        self._start: float | None = None
        self._samples = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        if self._step <= self.warmup:
            self._start = time.perf_counter()
            return
        self._samples += int((logs or {}).get("size", self.batch_size))
        if (self._step - self.warmup) % self.every == 0 and self._start is not None:
            now = time.perf_counter()
            rate = self._samples / max(now - self._start, 1e-9)
            self.history.append((self._step, rate))
            if self.writer is not None:
                with self.writer.as_default():
                    tf.summary.scalar("throughput", rate, step=self._step)
            if self.verbose:
                print(f"step {self._step}: {rate:,.0f} samples/s")
            self._start, self._samples = now, 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.writer is not None:
            self.writer.flush()

    def mean(self) -> float:
        return sum(r for _, r in self.history) / len(self.history) if self.history else float("nan")
