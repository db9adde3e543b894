"""Profile a few training steps and read the trace back: where does a step's time go?

`ProfileSteps` is a Keras callback (``model.fit`` and `fit` both take it) that records steps
``start .. start + steps - 1`` with TensorFlow's profiler into ``log_dir/plugins/profile/<run>/``,
where TensorBoard's Profile tab finds them. `op_breakdown` reads that trace (the XPlane protobuf
TensorFlow writes) and sums the time of every TensorFlow op by what it belongs to:

* ``phase``: ``forward``, ``backward`` (ops under ``gradient_tape/``), ``optimizer`` (under the
  optimizer's name scope) or ``input`` (the time tf.data's threads were busy);
* ``part``: the layer (or ``tf.name_scope``) directly under the model, ``_1`` suffixes removed;
  ``other`` for ops outside any layer (loss, metrics, input casts).

Times are CPU time summed over threads, so on a multi-core machine they can add up to more than
the wall time of the traced steps. A pipeline whose loader works in Python threads (like
`ParquetLoader`) shows no input row: its cost appears as wall time the ops do not cover.
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf

from kernels import checks

_SUFFIX = re.compile(r"_\d+$")


class ProfileSteps(keras.callbacks.Callback):
    """Trace training steps ``start .. start + steps - 1`` (1-based, counted over the whole run).

    Args:
        log_dir: TensorBoard log directory of the run; the trace goes to ``plugins/profile``.
        start: first step traced (leave a few for graph tracing and warm-up).
        steps: steps traced (a handful: traces grow fast).

    After training, ``self.seconds`` is the wall time of the traced steps and ``self.traced``
    the number of steps traced.
    """

    def __init__(self, log_dir: str | Path, start: int = 10, steps: int = 5):
        super().__init__()
        self.log_dir = Path(log_dir)
        self.start = checks.positive_int("start", start)
        self.steps = checks.positive_int("steps", steps)
        self._seen, self._began, self._active = 0, 0.0, False
        self.seconds, self.traced = 0.0, 0

    def _begin(self) -> None:
        import time

        tf.profiler.experimental.start(str(self.log_dir))
        self._active, self._began = True, time.perf_counter()

    def _end(self) -> None:
        import time

        tf.profiler.experimental.stop()
        self.seconds, self._active = time.perf_counter() - self._began, False

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._seen += 1
        if self._seen == self.start - 1 or (self.start == 1 and self._seen == 0):
            self._begin()
        elif self._active:
            self.traced = self._seen - self.start + 1
            if self.traced >= self.steps:
                self._end()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.start == 1:
            self._begin()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._active:
            self._end()


def trace_files(log_dir: str | Path) -> list[Path]:
    """The ``*.xplane.pb`` traces under `log_dir`, oldest first."""
    return sorted(Path(log_dir).glob("plugins/profile/*/*.xplane.pb"), key=lambda p: p.stat().st_mtime)


_OP = re.compile(r"^[\w./-]+:_?\w+$")  # a TensorFlow op event: "scope/.../name:Type"
_CALL = "StatefulPartitionedCall/"
#: name scopes of the optimizers' ops (an optimizer's name: Keras' and `sok_tutorial.optimizers`')
OPTIMIZER_SCOPES = ("adam", "adamw", "sgd", "adagrad", "lazyadam", "lazy_adam", "row_wise_adagrad", "ftrl",
                    "rmsprop", "optimizer")


def _classify(name: str, optimizer_scopes: Sequence[str]) -> tuple[str, str]:
    """(phase, part) of a TensorFlow op event named ``scope/.../op:Type``."""
    while name.startswith(_CALL):
        name = name[len(_CALL):]
    path = name.split(":", 1)[0].split("/")
    phase = "forward"
    if path[0] == "gradient_tape":
        phase, path = "backward", path[1:]
    elif _SUFFIX.sub("", path[0]).lower() in optimizer_scopes:
        return "optimizer", _SUFFIX.sub("", path[1]).lower() if len(path) > 2 else "update"
    if len(path) < 3:  # not inside a layer of a model: the loss, metrics, casts of the inputs
        return phase, "other"
    return phase, _SUFFIX.sub("", path[1])  # path[0] is the model; its child names the part


def _busy(events: Any) -> float:
    """Wall time (ps) a thread spent inside any event: the union of their intervals."""
    spans = sorted((e.offset_ps, e.offset_ps + e.duration_ps) for e in events)
    busy, end = 0, -1
    for a, b in spans:
        if a >= end:
            busy, end = busy + b - a, b
        elif b > end:
            busy, end = busy + b - end, b
    return busy


def op_breakdown(log_dir_or_trace: str | Path, *, steps: int | None = None,
                 optimizer_scopes: Sequence[str] = OPTIMIZER_SCOPES, by: str = "part") -> list[dict[str, Any]]:
    """Milliseconds of CPU time per ``(phase, part)`` in the newest trace under `log_dir_or_trace`.

    TensorFlow ops are attributed to their phase and part (see the module docstring); the
    tf.data threads count as one row, ``("input", "tf.data")``, the time they were busy. Returns
    rows ``{"phase", "part", "ms", "share"}`` sorted by time: ``ms`` per step when `steps` is
    given, ``share`` of the total. ``by="op"`` gives the part as the op's TensorFlow type
    (``ResourceGatherNd``, ``Unique``...) instead of the layer, to see which kernels a step spends on.

    Example:
        >>> import tempfile
        >>> log_dir = tempfile.mkdtemp()
        >>> layer = keras.layers.Dense(4)
        >>> tf.profiler.experimental.start(log_dir)
        >>> _ = tf.function(lambda x: layer(x))(tf.ones([8, 3]))
        >>> tf.profiler.experimental.stop()
        >>> rows = op_breakdown(log_dir)
        >>> round(sum(r["share"] for r in rows), 6)
        1.0
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    checks.one_of("by", by, ("part", "op"))
    path = Path(log_dir_or_trace)
    if path.is_dir():
        files = trace_files(path)
        if not files:
            raise FileNotFoundError(f"log_dir_or_trace={str(path)!r} holds no plugins/profile/*/*.xplane.pb trace; "
                                    "record one with ProfileSteps or tf.profiler.experimental.start/stop")
        path = files[-1]
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    scopes = tuple(s.lower() for s in optimizer_scopes)
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for plane in space.planes:
        names = plane.event_metadata
        for line in plane.lines:
            if line.name.startswith("tf_data"):
                totals[("input", "tf.data")] += _busy(line.events) / 1e9
                continue
            for event in line.events:
                name = names[event.metadata_id].name
                if _OP.match(name):
                    phase, part = _classify(name, scopes)
                    totals[(phase, name.rsplit(":", 1)[1]) if by == "op" else (phase, part)] += event.duration_ps / 1e9
    total = sum(totals.values()) or 1.0
    div = steps or 1
    rows = [{"phase": p, "part": q, "ms": v / div, "share": v / total} for (p, q), v in totals.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def phase_totals(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Sum `op_breakdown` rows by phase: ``{"forward": ms, "backward": ms, ...}``."""
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        out[r["phase"]] += r["ms"]
    return dict(out)
