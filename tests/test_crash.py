"""SIGKILL in the middle of every writer: the reader still sees the previous complete output, byte
for byte, and the next write to the same place cleans what the killed one left behind.

Each case writes version 1 to completion in a child process, then starts version 2 in another
child that stops itself at a kill point (while writing data, or just before publishing) and
is killed there; the parent compares every byte of the output with version 1, then writes
version 2 again and checks that no temporary sibling is left. These child-process loops are the
``slow`` tier; the fast tier keeps the function-level repair test at the end of this file and the
writers' own tests of what an interrupted write leaves behind.
"""
from __future__ import annotations

import hashlib
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WRITERS = {
    "dataset": """
        import pandas as pd
        from sok_tutorial.data import to_parquet_dataset
        n = 40 * VERSION
        frame = pd.DataFrame({"item": [i % 7 for i in range(n)], "label": [i % 2 for i in range(n)]})
        to_parquet_dataset(frame, OUT, cat_names=["item"], label_names=["label"], cardinalities={"item": 7},
                           row_group_size=16, overwrite=True, progress=False)
    """,
    "convert_files": """
        import pyarrow as pa, pyarrow.parquet as pq
        from sok_tutorial.data import convert_files
        files = []
        for i in range(2):
            files.append(OUT.parent / f"in-{VERSION}-{i}.parquet")
            pq.write_table(pa.table({"item": list(range(10 * VERSION)), "label": [0] * (10 * VERSION)}), files[-1])
        convert_files(files, OUT, cat_names=["item"], label_names=["label"], cardinalities={"item": 100},
                      scheduler="synchronous", overwrite=True, progress=False)
    """,
    "tfrecords": """
        import pandas as pd
        from sok_tutorial.data import to_parquet_dataset
        from sok_tutorial.data.tfrecord import write_tfrecords
        source = OUT.parent / f"source-{VERSION}"
        if not source.exists():
            to_parquet_dataset(pd.DataFrame({"item": list(range(30 * VERSION)), "label": [1] * (30 * VERSION)}),
                               source, cat_names=["item"], label_names=["label"], cardinalities={"item": 99},
                               progress=False)
        write_tfrecords(source, OUT, label_names=["label"], cat_names=["item"], overwrite=True, progress=False)
    """,
    "criteo_generator": """
        from data_gen.criteo import write_criteo_parquet
        write_criteo_parquet(OUT, 100 * VERSION, cardinalities=[50] * 26, seed=VERSION, overwrite=True,
                             progress=False)
    """,
    "checkpoint": """
        import keras, numpy as np
        import sok_tutorial as sok
        from sok_tutorial.training import save_checkpoint
        inp = keras.Input([2], dtype="int64")
        model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(
            sok.DistributedEmbedding("sum", 50, 3, slot_num=2, max_nnz=1)(inp))))
        model(np.arange(2 * VERSION).reshape(-1, 2))
        save_checkpoint(OUT, model, overwrite=True, state={"version": VERSION})
    """,
    "workflow": """
        import pyarrow as pa
        from sok_tutorial.data import Workflow
        table = pa.table({"user": [f"u{i}" for i in range(5 * VERSION)], "rating": [4.0] * (5 * VERSION)})
        Workflow(cat_names=["user"], label=("rating", 3.5), label_name="liked").fit(table).save(OUT, overwrite=True)
    """,
}

CHILD = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
OUT, VERSION, STOP = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def stop_here(name):
    # stop in `original` once the write has begun (its temporary sibling exists), until killed
    def wrap(original):
        def stopped(*args, **kwargs):
            result = original(*args, **kwargs)
            if any(p.name.startswith(f".{{OUT.name}}.tmp-") for p in OUT.parent.iterdir()):
                print("stopped", flush=True)
                time.sleep(600)
            return result
        return stopped
    return wrap

if STOP == "publish":
    import sok_tutorial.atomic as atomic
    atomic._fsync_tree = stop_here("publish")(atomic._fsync_tree)
elif STOP == "data":
    import numpy as np, pyarrow.parquet as pq
    pq.ParquetWriter.write_table = stop_here("data")(pq.ParquetWriter.write_table)
    np.savez = stop_here("data")(np.savez)
    if {tfrecords}:  # (the other writers' children never load TensorFlow, a few seconds each)
        import tensorflow as tf
        tf.io.TFRecordWriter.write = stop_here("data")(tf.io.TFRecordWriter.write)
{body}
print("done", flush=True)
"""


def _child(tmp_path: Path, writer: str) -> Path:
    script = tmp_path / f"{writer}.py"
    script.write_text(CHILD.format(root=str(ROOT), body=textwrap.dedent(WRITERS[writer]),
                                   tfrecords=writer == "tfrecords"))
    return script


def _run(script: Path, out: Path, version: int, stop: str = "none") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), str(out), str(version), stop], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


# (a Workflow writes small files in one go: only its publish is a point to stop at)
KILL_POINTS = [(w, s) for w in sorted(WRITERS) for s in ("data", "publish") if (w, s) != ("workflow", "data")]


@pytest.mark.slow
@pytest.mark.parametrize("writer,stop", KILL_POINTS)
def test_sigkill_mid_write_leaves_the_previous_output_whole(tmp_path, writer, stop):
    script, out = _child(tmp_path, writer), tmp_path / "out"
    first = _run(script, out, 1)
    assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    before = _digest(out)
    second = _run(script, out, 2, stop)
    try:
        ready, _, _ = select.select([second.stdout], [], [], 240)  # never wait on a child forever
        line = second.stdout.readline() if ready else "(nothing within 240 s)"
        assert line.strip() == "stopped", line
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(timeout=60)
    assert _digest(out) == before  # every byte of version 1, nothing of version 2
    assert _leftovers(out), "the killed write should have left its temporary sibling"
    third = _run(script, out, 2)
    assert third.wait(timeout=300) == 0, third.stderr.read()[-3000:]
    assert _digest(out) != before and not _leftovers(out)


def test_a_kill_between_moving_the_old_output_aside_and_the_new_one_in_is_repaired(tmp_path, monkeypatch):
    """Where the system cannot swap two paths in one step: the next write puts the old output back
    before it starts, so a reader never finds the path missing for longer than that."""
    from sok_tutorial import atomic

    out = tmp_path / "ds"
    out.mkdir()
    (out / atomic.MARKER).write_text("")
    (out / "data").write_text("version 1")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    aside = tmp_path / f".ds.old-{atomic._HOST}-{dead.pid}-{'c' * 12}"
    os.replace(out, aside)  # what a kill right after the first rename leaves
    assert atomic.clean_stale(out) == [] and (out / "data").read_text() == "version 1" and not aside.exists()


def test_a_writer_killed_before_its_publish_leaves_the_previous_output_and_the_next_write_cleans_up(tmp_path):
    """What the SIGKILL loops above check in child processes, at the level of the functions: a
    write that stops after filling its temporary sibling (its process then gone) changes nothing a
    reader sees, and the next write removes what it left."""
    from sok_tutorial import atomic

    out = tmp_path / "ds"
    with atomic.atomic_directory(out, overwrite=False) as tmp:
        (tmp / "data").write_text("version 1")
    before = _digest(out)
    half = atomic.begin_directory(out, overwrite=True)
    (half / "data").write_text("version 2, half writ")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = half.with_name(half.name.replace(f"-{os.getpid()}-", f"-{dead.pid}-"))
    os.replace(half, orphan)  # the writer is gone: its temporary sibling now names a dead process
    assert _digest(out) == before and _leftovers(out) == [orphan.name]
    with atomic.atomic_directory(out, overwrite=True) as tmp:
        (tmp / "data").write_text("version 2")
    assert (out / "data").read_text() == "version 2" and not _leftovers(out)
