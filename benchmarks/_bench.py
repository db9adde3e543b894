"""Shared by the benchmark scripts: machine description, repeated timing, table and JSON output.

Each script prints a table and writes ``<out>/<name>.json`` as
``{"benchmark": name, "machine": {...}, "rows": [{"case": ..., <figures>}]}``. Cases that are
compared are measured in the same run, interleaved, so the ratio survives a noisy machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default="build/bench", help="directory for the JSON result")
    p.add_argument("--quick", action="store_true", help="small sizes, for a fast check")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions per case (median reported)")
    return p


def machine() -> dict[str, Any]:
    import numpy
    import pyarrow

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": numpy.__version__, "pyarrow": pyarrow.__version__}
    try:
        import psutil
        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    from kernels import backend
    info["gpu"] = backend.info()["cupy"]
    return info


def interleaved(cases: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Run every case once (warm-up), then `repeat` rounds of all cases in turn; seconds per run."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def page_faults() -> int:
    """Page faults this process has taken so far (minor ones: a page of memory first touched, no
    disk read); 0 where the system does not count them."""
    try:
        import resource
    except ImportError:  # (not a Unix)
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(name: str, rows: list[dict[str, Any]], out: str, notes: dict[str, Any] | None = None) -> Path:
    """Print `rows` as a table and write the JSON result."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for r in cells:
        print(" | ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    path = Path(out) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "machine": machine(), "rows": rows, **({"notes": notes} if notes else {})}
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {path}", file=sys.stderr)
    return path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def draw_keys(rng, rows: int, shape: tuple, keys: str):
    """Uniform row ids (the worst case for sparse updates) or Criteo-like Zipf frequencies."""
    import numpy as np

    if keys == "uniform":
        return rng.integers(0, rows, shape)
    s = 1.1  # the Criteo-like generator's mean exponent, power law over ranks [1, rows]
    u = rng.random(shape)
    rank = np.floor((1 + u * ((rows + 1.0) ** (1 - s) - 1)) ** (1 / (1 - s))).astype(np.int64) - 1
    return np.random.default_rng(123).permutation(rows)[np.clip(rank, 0, rows - 1)]


def seconds_per_step(step, batches: list, steps: int, warmup: int = 2) -> float:
    """Mean seconds of `steps` calls of ``step(*batch)`` over `batches` in turn, after `warmup` calls
    (tracing); the last loss is read before the clock stops, so queued work is counted."""
    import time

    for i in range(warmup):
        step(*batches[i % len(batches)])
    start = time.perf_counter()
    for i in range(steps):
        loss = step(*batches[i % len(batches)])
    float(loss)
    return (time.perf_counter() - start) / steps
