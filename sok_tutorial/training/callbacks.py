"""Keras callbacks for recommender training, usable in ``model.fit`` and in `fit`."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from kernels import checks
from sok_tutorial.training.loop import evaluate


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

    def rate(self, excluding: float = 0.0) -> float:
        """Samples per second over all steps after the warm-up (NaN before any), less `excluding`
        seconds spent in that time on something else (e.g. `ValidationAUC.seconds_between`)."""
        if self._first is None or self._end is None or self._end - excluding <= self._first:
            return float("nan")
        return self._total_samples / (self._end - self._first - excluding)

    def mean(self) -> float:
        """Mean of the windows' rates (NaN before the first window)."""
        return sum(r for _, r in self.history) / len(self.history) if self.history else float("nan")


class StepLosses(keras.callbacks.Callback):
    """Each training step's own loss, in ``losses``.

    Keras reports the running mean of the epoch's losses after each step; the step's own loss is
    recovered from two consecutive means (``(b + 1) * mean_b - b * mean_{b-1}``), which is what a
    plot of a loss curve needs. Restarts with every epoch, as Keras' mean does, and keeps
    appending. Use it with ``steps_per_execution=1`` (Keras' default), where every step reports.

    Example:
        >>> import numpy as np
        >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
        >>> model.compile(keras.optimizers.SGD(0.0), "mse")  # a rate of 0: the loss of each batch is known
        >>> model.layers[0].set_weights([np.zeros((1, 1))])
        >>> losses = StepLosses()
        >>> _ = model.fit(np.zeros((6, 1)), np.array([1.0, 1, 2, 2, 3, 3]), batch_size=2, shuffle=False,
        ...               callbacks=[losses], verbose=0)
        >>> [round(x, 4) for x in losses.losses]
        [1.0, 4.0, 9.0]
    """

    def __init__(self):
        super().__init__()
        self.losses: list[float] = []
        self._sum = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._sum = 0.0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        total = (batch + 1) * float((logs or {})["loss"])
        self.losses.append(total - self._sum)
        self._sum = total


class ValidationAUC(keras.callbacks.Callback):
    """The validation AUC every `every` training steps (and at the end), for a learning curve.

    ``history`` holds ``(step, auc)`` pairs; each is also written to TensorBoard as ``val_auc``
    when `log_dir` is given. ``seconds`` holds each evaluation's duration, so a throughput figure
    can leave them out (`seconds_between`). The AUC is exact over the loader's rows
    (`sok_tutorial.training.evaluate`), so curves of different models on the same loader compare.

    Args:
        loader: validation batches ``(features, labels)``, read once per evaluation.
        every: training steps between evaluations.
        from_logits: whether the model outputs logits (else probabilities).
        max_batches: evaluate on at most this many batches (None: all).
        log_dir: a TensorBoard run directory.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> x = rng.normal(size=(512, 2)).astype("float32")
        >>> y = (x[:, :1] > 0).astype("float32")
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(keras.optimizers.SGD(0.5), keras.losses.BinaryCrossentropy(from_logits=True))
        >>> curve = ValidationAUC([(x[:256], y[:256])], every=4)
        >>> _ = model.fit(x, y, batch_size=32, epochs=1, callbacks=[curve], verbose=0)
        >>> [step for step, _ in curve.history], curve.history[-1][1] > 0.9
        ([4, 8, 12, 16], True)
    """

    def __init__(self, loader: Any, every: int, *, from_logits: bool = True, max_batches: int | None = None,
                 log_dir: str | Path | None = None):
        super().__init__()
        self.loader, self.every = loader, checks.positive_int("every", every)
        self.from_logits, self.max_batches = from_logits, max_batches
        self.writer = tf.summary.create_file_writer(str(log_dir)) if log_dir is not None else None
        self.history: list[tuple[int, float]] = []
        self.seconds: list[float] = []
        self._step = 0

    def seconds_between(self, first: int, last: int) -> float:
        """Seconds spent evaluating after step `first` and before step `last` ended: the time a
        `ThroughputLogger` warmed up for `first` steps counted in a run of `last` steps."""
        return sum(s for (step, _), s in zip(self.history, self.seconds) if first <= step < last)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._step += 1
        if self._step % self.every == 0:
            self._evaluate()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if not self.history or self.history[-1][0] != self._step:
            self._evaluate()

    def _evaluate(self) -> None:
        start = time.perf_counter()
        auc = evaluate(self.model, self.loader, from_logits=self.from_logits, max_batches=self.max_batches)["auc"]
        self.history.append((self._step, auc))
        self.seconds.append(time.perf_counter() - start)
        if self.writer is not None:
            with self.writer.as_default():
                tf.summary.scalar("val_auc", auc, step=self._step)
            self.writer.flush()
