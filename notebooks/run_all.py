"""Run every notebook end to end with papermill (``make tutorial``).

For each ``notebooks/NN-*.ipynb`` in order this writes, under ``--build-dir``:

    notebooks/<name>/<name>.ipynb   the executed notebook
    notebooks/<name>/<name>.html    an HTML rendering of it
    notebooks/<name>/metrics.json   the numbers the notebook measured (and its plots, logs)
    tensorboard/suite/              wall time and numeric metrics of every notebook as scalars
    summary.md, summary.json        one row per notebook: status, wall time, key metrics

A notebook whose source, parameters and library code are unchanged since its last successful
run is skipped, so a second ``make tutorial`` is quick. Data generation inside the notebooks
reuses datasets whose parameters did not change. TensorFlow's C++ warnings (graph optimiser
notes) are kept out of the executed notebooks (``TF_CPP_MIN_LOG_LEVEL=2`` unless set; the few
start-up lines TensorFlow prints before reading it remain); errors still show.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = ("sok_tutorial", "kernels", "data_gen")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # inherited by the notebook kernels


def notebooks(only: list[str] | None = None) -> list[Path]:
    found = sorted(p for p in HERE.glob("[0-9][0-9]-*.ipynb"))
    if only:
        found = [p for p in found if any(p.name.startswith(o) or p.stem == o for o in only)]
    return found


def source_digest() -> str:
    h = hashlib.sha256()
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix in (".py", ".cu") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def stamp_of(notebook: Path, parameters: dict[str, Any], sources: str) -> str:
    h = hashlib.sha256(notebook.read_bytes())
    h.update(json.dumps(parameters, sort_keys=True).encode())
    h.update(sources.encode())
    return h.hexdigest()


def render_html(executed: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nbformat.read(executed, as_version=4))
    html = executed.with_suffix(".html")
    html.write_text(body, encoding="utf-8")
    return html


def key_metrics(metrics: dict[str, Any], limit: int = 6) -> dict[str, float]:
    """The first few scalar numbers a notebook reported (notebooks list their headline first)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value
        if len(out) == limit:
            break
    return out


def log_scalars(log_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Suite results as TensorBoard scalars: one tag per notebook and metric."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(log_dir))
    for row in rows:
        values = [summary_pb2.Summary.Value(tag=f"{row['notebook']}/wall_seconds", simple_value=row["seconds"])]
        for key, value in row.get("all_metrics", {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values.append(summary_pb2.Summary.Value(tag=f"{row['notebook']}/{key}", simple_value=float(value)))
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=0, summary=summary_pb2.Summary(value=values)))
    writer.close()


def write_summary(build: Path, rows: list[dict[str, Any]]) -> None:
    lines = ["| notebook | status | wall time (s) | key metrics |", "|---|---|---:|---|"]
    for row in rows:
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row["metrics"].items())
        lines.append(f"| {row['notebook']} | {row['status']} | {row['seconds']:.1f} | {metrics} |")
    (build / "summary.md").write_text("\n".join(lines) + "\n")
    (build / "summary.json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k != "all_metrics"} for r in rows], indent=2) + "\n")
    print("\n".join(lines))


def run_one(notebook: Path, build: Path, sources: str, force: bool) -> dict[str, Any]:
    import papermill as pm

    out_dir = build / "notebooks" / notebook.stem
    parameters = {"DATA_DIR": str(build / "data"), "OUTPUT_DIR": str(out_dir), "PROGRESS": False}
    stamp = stamp_of(notebook, parameters, sources)
    stamp_file = out_dir / ".stamp"
    executed = out_dir / notebook.name
    row: dict[str, Any] = {"notebook": notebook.stem}
    if not force and stamp_file.is_file() and stamp_file.read_text() == stamp and (out_dir / "metrics.json").is_file():
        previous = json.loads((out_dir / "run.json").read_text())
        metrics = json.loads((out_dir / "metrics.json").read_text())
        return {**row, "status": "up to date", "seconds": previous["seconds"], "metrics": key_metrics(metrics),
                "all_metrics": metrics}
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp_file.unlink(missing_ok=True)
    (out_dir / "metrics.json").unlink(missing_ok=True)
    print(f"== {notebook.name}", flush=True)
    start = time.perf_counter()
    try:
        pm.execute_notebook(str(notebook), str(executed), parameters=parameters, cwd=str(HERE),
                            kernel_name="python3", progress_bar=True, log_output=False)
        status = "ok"
    except Exception as exc:  # papermill raises PapermillExecutionError with the cell's traceback
        status = "failed"
        print(f"!! {notebook.name} failed:\n{exc}", file=sys.stderr)
    seconds = time.perf_counter() - start
    if executed.is_file():
        try:
            render_html(executed)
        except Exception:
            traceback.print_exc()
    metrics = json.loads((out_dir / "metrics.json").read_text()) if (out_dir / "metrics.json").is_file() else {}
    (out_dir / "run.json").write_text(json.dumps({"seconds": seconds, "status": status}) + "\n")
    if status == "ok":
        stamp_file.write_text(stamp)
    return {**row, "status": status, "seconds": seconds, "metrics": key_metrics(metrics), "all_metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", default=str(ROOT / "build"))
    parser.add_argument("--only", nargs="*", help="notebook numbers or names, e.g. 01 03")
    parser.add_argument("--force", action="store_true", help="rerun even if up to date")
    args = parser.parse_args(argv)
    build = Path(args.build_dir).resolve()
    build.mkdir(parents=True, exist_ok=True)
    sources = source_digest()
    start = time.perf_counter()
    rows = [run_one(nb, build, sources, args.force) for nb in notebooks(args.only)]
    log_scalars(build / "tensorboard" / "suite", rows)
    write_summary(build, rows)
    print(f"\nsuite wall time {time.perf_counter() - start:.1f} s; executed notebooks and HTML under "
          f"{build / 'notebooks'}; TensorBoard: tensorboard --logdir {build}")
    return 0 if all(r["status"] != "failed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
