"""`fit`: the training loop of the notebooks that do not use plain ``model.fit``.

It logs the loss and samples/s and evaluates AUC every ``eval_interval`` steps (to stdout,
TensorBoard and the returned `History`), writes snapshots (`sok_tutorial.training.checkpoint`)
every ``snapshot_interval`` steps and resumes from the latest one, so an interrupted run
continues exactly where it stopped: same batches, same optimizer state, same results as if it
had never stopped. With ``patience`` it stops once the validation AUC (or loss) has not improved
for that many evaluations, and ``restore_best_weights`` gives the model back as it was at its
best evaluation: Keras' ``EarlyStopping``, for this loop.
"""
from __future__ import annotations

import math
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kernels import checks
from sok_tutorial.progress import progress_bar
from sok_tutorial.training.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    step_dir,
)
from sok_tutorial.training.metrics import roc_auc


@dataclass
class History:
    """What `fit` measured, step by step."""

    step: list[int] = field(default_factory=list)  # logging points
    loss: list[float] = field(default_factory=list)  # mean training loss since the previous point
    samples_per_s: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    eval_auc: list[float] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)
    resumed_from: int | None = None
    best_step: int | None = None  # the evaluation with the best monitored value
    best_value: float | None = None
    stopped_early: bool = False  # `patience` evaluations without improvement ended training
    restored_best: bool = False  # the model was given back as it was at `best_step`

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_PREDICTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (its variables' ids, predict)


def predictor(model: Any) -> Any:
    """``model(features, training=False)`` as a `tf.function`, one per model (made again only when
    the model's variables are other objects than when it was made), so that evaluating every few
    steps traces the model once rather than at every evaluation; shapes that vary (a last, shorter
    batch) share one trace (``reduce_retracing``). It holds the model by a weak reference.

    Example:
        >>> model = keras.Sequential([keras.layers.Dense(1)])
        >>> _ = [predictor(model)(np.ones((n, 3), np.float32)) for n in (4, 4, 2)]
        >>> predictor(model) is predictor(model), predictor(model).experimental_get_tracing_count()
        (True, 2)
    """
    ids = tuple(id(v) for v in model.variables)
    held = _PREDICTORS.get(model)
    if held is None or held[0] != ids:
        ref = weakref.ref(model)
        held = _PREDICTORS[model] = ids, tf.function(lambda features: ref()(features, training=False),
                                                      reduce_retracing=True)
    return held[1]


def evaluate(model: Any, loader: Iterable[Any], *, from_logits: bool = True, max_batches: int | None = None,
             loss: Any = None) -> dict[str, float]:
    """AUC (exact: `sok_tutorial.training.metrics.roc_auc`) and mean loss of `model` over `loader`
    (at most `max_batches` batches). The model's forward pass is traced once for all the calls
    (`predictor`)."""
    scores, targets = [], []
    loss_fn = loss or keras.losses.BinaryCrossentropy(from_logits=from_logits)
    total, count = 0.0, 0
    predict = predictor(model)
    for i, (features, labels) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        out = predict(features)
        scores.append(np.asarray(out, np.float64).reshape(-1))
        targets.append(np.asarray(labels).reshape(-1))
        n = int(labels.shape[0])
        total += float(loss_fn(labels, out)) * n
        count += n
    if not count:
        raise ValueError("evaluate: the evaluation loader yielded no batches")
    labels = np.concatenate(targets)
    auc = roc_auc(labels, np.concatenate(scores))
    if math.isnan(auc):
        positives = int(np.count_nonzero(labels))
        warnings.warn(f"evaluate: AUC is undefined (NaN): the {count} evaluation labels hold {positives} positives "
                      f"and {count - positives} negatives; AUC needs both classes", RuntimeWarning, stacklevel=2)
    return {"auc": auc, "loss": total / count}


def _epoch(loader: Any, epoch: int) -> Iterable[Any]:
    """The batches of epoch `epoch` (a loader with an ``epoch`` replays that epoch exactly)."""
    if hasattr(loader, "epoch"):
        loader.epoch = epoch
    return loader


def fit(model: Any, train_loader: Any, *, optimizer: Any = None, loss: Any = None, from_logits: bool = True,
        eval_loader: Any = None, eval_interval: int | None = None, max_eval_batches: int | None = None,
        snapshot_interval: int | None = None, snapshot_dir: str | Path | None = None, keep_last: int | None = 3,
        max_steps: int | None = None, epochs: int | None = None, log_interval: int = 50,
        log_dir: str | Path | None = None, callbacks: Sequence[Any] = (), resume: bool = True,
        patience: int | None = None, monitor: str = "auc", min_delta: float = 0.0,
        restore_best_weights: bool = False, progress: bool = True, verbose: int | bool = 1) -> History:
    """Train `model` on `train_loader` (batches of ``(features, labels)``).

    Args:
        optimizer: defaults to ``model.optimizer`` (a compiled model); sparse optimizers of
            `sok_tutorial.optimizers` update only the table rows a step used.
        loss: defaults to binary cross-entropy on the model's output (``from_logits``). Training
            adds the terms the model adds (``model.losses``, e.g. `EmbeddingMLP`'s ``l2``);
            evaluation does not.
        eval_loader, eval_interval, max_eval_batches: validation AUC and loss every
            `eval_interval` steps (and at the end), over at most `max_eval_batches` batches.
        snapshot_interval, snapshot_dir: write a checkpoint every `snapshot_interval` steps (and at
            the end); with ``resume=True`` training continues from the latest one found there.
        keep_last: snapshots kept in `snapshot_dir`, the newest (``None``: every one).
        max_steps, epochs: when to stop (one of them; default one epoch). A re-iterable loader
            (`ParquetLoader`) is read again for each epoch; a one-pass iterator (a generator) ends
            training when it runs out, with a message, even before `max_steps`.
        log_interval: steps between logged points (loss mean, samples/s).
        log_dir: TensorBoard logs (scalars ``loss``, ``samples_per_s``, ``eval_auc``, ``eval_loss``).
        callbacks: Keras callbacks; as in ``model.fit``, ``on_train_batch_end(batch, logs)`` gets the
            batch's index within the epoch, and `logs` carries ``loss`` and ``size``.
        patience: stop after this many evaluations in a row without an improvement of the
            `monitor`ed value by more than `min_delta` (needs `eval_interval`); None trains on.
        monitor: ``"auc"`` (higher is better) or ``"loss"`` (lower is better), on `eval_loader`.
        restore_best_weights: at the end, give the model back as it was at its best evaluation
            (the optimizer keeps its latest state). The best model is a checkpoint, kept in
            ``snapshot_dir/best`` (which a resumed run uses) or else in a temporary directory.
        progress: a tqdm bar over the steps.
        verbose: print one line per logged point (step, loss, samples/s) and per evaluation (step,
            AUC, loss) to stdout, above the bar; ``0`` prints nothing.

    Returns:
        `History`.

    Example:
        >>> import keras, numpy as np, tensorflow as tf
        >>> import sok_tutorial as sok
        >>> from sok_tutorial.models import EmbeddingMLP
        >>> rng = np.random.default_rng(0)
        >>> users = rng.integers(0, 50, 4096)
        >>> labels = (rng.random(4096) < np.where(users % 2, 0.8, 0.2)).astype("float32")[:, None]
        >>> batches = [({"user": tf.constant(users[i:i + 256])}, tf.constant(labels[i:i + 256]))
        ...            for i in range(0, 3072, 256)]
        >>> valid = [({"user": tf.constant(users[3072:])}, tf.constant(labels[3072:]))]
        >>> model = EmbeddingMLP({"user": 50}, dims=4, hidden=[8])
        >>> model.compile(optimizer=sok.optimizers.Adam(0.05))
        >>> h = fit(model, batches, epochs=20, eval_loader=valid, eval_interval=12, patience=3,
        ...         restore_best_weights=True, progress=False, verbose=0)
        >>> h.stopped_early, h.restored_best, h.best_value > 0.7
        (True, True, True)
    """
    optimizer = optimizer or getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError("fit: pass an optimizer, or compile the model with one")
    if max_steps is not None and epochs is not None:
        raise ValueError("fit: give max_steps or epochs, not both")
    epochs = 1 if max_steps is None and epochs is None else epochs
    if max_steps is not None:
        checks.positive_int("max_steps", max_steps)
    if epochs is not None:
        checks.positive_int("epochs", epochs)
    checks.positive_int("log_interval", log_interval)
    if keep_last is not None:
        checks.positive_int("keep_last", keep_last)
    if eval_interval is not None:
        checks.positive_int("eval_interval", eval_interval)
        if eval_loader is None:
            raise ValueError("fit: eval_interval needs an eval_loader")
    checks.one_of("monitor", monitor, ("auc", "loss"))
    if patience is not None:
        checks.positive_int("patience", patience)
        if eval_interval is None:
            raise ValueError(f"fit: patience={patience} needs evaluations: pass eval_loader and eval_interval")
    if restore_best_weights and eval_loader is None:
        raise ValueError("fit: restore_best_weights=True needs an eval_loader to find the best weights")
    if isinstance(min_delta, bool) or not (isinstance(min_delta, (int, float)) and 0 <= min_delta < math.inf):
        raise ValueError(f"fit: min_delta={min_delta!r}, expected a finite number >= 0")
    if snapshot_interval is not None:
        checks.positive_int("snapshot_interval", snapshot_interval)
        if snapshot_dir is None:
            raise ValueError("fit: snapshot_interval needs a snapshot_dir")
    loss_fn = loss or keras.losses.BinaryCrossentropy(from_logits=from_logits)
    batches_per_epoch = len(train_loader) if hasattr(train_loader, "__len__") else None
    total = max_steps if max_steps is not None else (epochs * batches_per_epoch if batches_per_epoch else None)

    @tf.function
    def train_step(features: Any, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            value = loss_fn(labels, model(features, training=True))
            if model.losses:  # regularisation the model adds (e.g. EmbeddingMLP(l2=...))
                value += tf.add_n([tf.cast(x, value.dtype) for x in model.losses])
        optimizer.apply(tape.gradient(value, model.trainable_variables), model.trainable_variables)
        return value

    history = History()
    step, epoch, skip, waited = 0, 0, 0, 0
    scratch = None  # a temporary directory for the best weights when there is no snapshot_dir
    if restore_best_weights:
        if snapshot_dir is None:
            scratch = tempfile.TemporaryDirectory(prefix="sok-best-")
        best_dir = Path(scratch.name if scratch else snapshot_dir) / "best"
    if snapshot_dir is not None and resume and (last := latest_checkpoint(snapshot_dir)) is not None:
        _build(model, optimizer, train_loader)
        state = load_checkpoint(last, model, optimizer)
        step, epoch, skip = state["step"], state["epoch"], state["batch_in_epoch"]
        history.resumed_from = step
        history.best_step, history.best_value = state.get("best_step"), state.get("best_value")
        waited = state.get("evals_since_best", 0)
    writer = tf.summary.create_file_writer(str(log_dir)) if log_dir is not None else None
    for cb in callbacks:
        cb.set_model(model)
        cb.on_train_begin()
    bar = progress_bar(progress, total=total, desc="train", unit="step", unit_scale=False)
    bar.update(step)
    say = getattr(bar, "write", print)  # tqdm.write keeps the bar intact below the line
    window_loss, window_steps, window_samples, window_start = 0.0, 0, 0, time.perf_counter()

    def log_point() -> None:
        nonlocal window_loss, window_steps, window_samples, window_start
        if not window_steps:
            return
        now = time.perf_counter()
        history.step.append(step)
        history.loss.append(window_loss / window_steps)
        history.samples_per_s.append(window_samples / max(now - window_start, 1e-9))
        _scalars(writer, step, loss=history.loss[-1], samples_per_s=history.samples_per_s[-1])
        bar.set_postfix_str(f"loss {history.loss[-1]:.4f}")
        if verbose:
            say(f"step {step}: loss {history.loss[-1]:.4f}, {history.samples_per_s[-1]:,.0f} samples/s")
        window_loss, window_steps, window_samples, window_start = 0.0, 0, 0, now

    def eval_point() -> bool:
        """Evaluate; True when `patience` evaluations in a row brought no improvement."""
        nonlocal waited
        result = evaluate(model, eval_loader, from_logits=from_logits, max_batches=max_eval_batches, loss=loss)
        history.eval_step.append(step)
        history.eval_auc.append(result["auc"])
        history.eval_loss.append(result["loss"])
        if math.isnan(result[monitor]) and (patience is not None or restore_best_weights):
            raise ValueError(f"fit: the validation {monitor} at step {step} is undefined (NaN), so it cannot pick "
                             f"the best step for patience={patience}, restore_best_weights={restore_best_weights}"
                             + (": eval_loader's labels are all of one class; give it both classes or pass "
                                "monitor='loss'" if monitor == "auc" else ": the model diverged"))
        sign = 1.0 if monitor == "auc" else -1.0  # compare so that larger is better
        if history.best_value is None or sign * (result[monitor] - history.best_value) > min_delta:
            history.best_step, history.best_value, waited = step, result[monitor], 0
            if restore_best_weights:
                save_checkpoint(best_dir, model, overwrite=True, state={"step": step})
        else:
            waited += 1
        _scalars(writer, step, eval_auc=result["auc"], eval_loss=result["loss"])
        bar.set_postfix_str(f"loss {history.loss[-1] if history.loss else math.nan:.4f} auc {result['auc']:.4f}")
        if verbose:
            say(f"step {step}: eval " + ", ".join(f"{k} {v:.4f}" for k, v in result.items())
                + ("" if waited else " (best so far)"))
        return patience is not None and waited >= patience

    def snapshot(batch_in_epoch: int) -> None:
        target = step_dir(snapshot_dir, step)
        save_checkpoint(target, model, optimizer, overwrite=True,
                        state={"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch,
                               "best_step": history.best_step, "best_value": history.best_value,
                               "evals_since_best": waited})
        history.snapshots.append(str(target))
        prune_checkpoints(snapshot_dir, keep_last)

    done = max_steps is not None and step >= max_steps
    seen = skip  # batches of the current epoch consumed (a resumed run may already be done)
    while not done and (epochs is None or epoch < epochs):
        seen = 0
        for cb in callbacks:
            cb.on_epoch_begin(epoch)
        for seen, (features, labels) in enumerate(_epoch(train_loader, epoch), start=1):
            if seen <= skip:  # resuming: these batches were trained before the snapshot
                continue
            value = float(train_step(features, labels))
            size = int(labels.shape[0])
            step += 1
            window_loss, window_steps, window_samples = window_loss + value, window_steps + 1, window_samples + size
            for cb in callbacks:
                cb.on_train_batch_end(seen - 1, {"loss": value, "size": size})
            bar.update()
            if step % log_interval == 0:
                log_point()
            stop = bool(eval_interval and step % eval_interval == 0 and eval_point())
            if snapshot_interval and step % snapshot_interval == 0:
                snapshot(seen)
            if stop:
                history.stopped_early = done = True
                if verbose:
                    say(f"fit: stopped at step {step}: no better validation {monitor} in {patience} evaluations "
                        f"since step {history.best_step}")
                break
            if max_steps is not None and step >= max_steps:
                done = True
                break
        for cb in callbacks:
            cb.on_epoch_end(epoch)
        if not done and not seen:  # an epoch without a batch: the data ran out (a one-pass
            if step == 0:             # generator) or there never was any; never spin on
                raise ValueError("fit: train_loader yielded no batches")
            say(f"fit: train_loader yielded no batches in epoch {epoch + 1}: the data ran out at step {step}"
                + (f", before max_steps={max_steps}" if max_steps is not None else "")
                + "; pass a re-iterable loader to train longer")
            break
        if not done:
            epoch, skip = epoch + 1, 0
    log_point()
    if eval_loader is not None and (not history.eval_step or history.eval_step[-1] != step):
        eval_point()
    if snapshot_dir is not None and (not history.snapshots or not history.snapshots[-1].endswith(f"{step:08d}")):
        snapshot(seen if done else 0)
    if restore_best_weights and history.best_step is not None and history.best_step != step:
        load_checkpoint(best_dir, model)  # the model only: the optimizer keeps its latest state
        history.restored_best = True
        if verbose:
            say(f"fit: restored the weights of step {history.best_step} (validation {monitor} "
                f"{history.best_value:.4f})")
    if scratch is not None:
        scratch.cleanup()
    bar.close()
    for cb in callbacks:
        cb.on_train_end()
    if writer is not None:
        writer.flush()
    return history


def _build(model: Any, optimizer: Any, loader: Any) -> None:
    """Create model and optimizer variables (before restoring them) from one batch."""
    if not model.built or not model.variables:
        features, _ = next(iter(loader))
        model(features, training=False)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)


def _scalars(writer: Any, step: int, **values: float) -> None:
    if writer is None:
        return
    with writer.as_default():
        for name, value in values.items():
            if value is not None and not (isinstance(value, float) and np.isnan(value)):
                tf.summary.scalar(name, value, step=step)
