"""Every public entry point of `sok_tutorial.training` fed bad input: the error type and a message
naming the argument; `fit` never spins on data that ran out; snapshots are pruned; a checkpoint
that does not fit changes nothing."""
from __future__ import annotations

import contextlib
import signal
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.training import (
    CheckpointMismatch,
    ProfileSteps,
    evaluate,
    fit,
    load_checkpoint,
    load_export,
    op_breakdown,
    save_checkpoint,
)
from sok_tutorial.training.checkpoint import checkpoints
from sok_tutorial.training.delta import apply_delta, export_delta


def _model(dynamic: bool = True) -> keras.Model:
    inp = keras.Input([2], dtype="int64")
    x = keras.layers.Flatten()(sok.DistributedEmbedding("sum", 64, 3, slot_num=2, max_nnz=1, use_hashtable=dynamic,
                                                        name="items")(inp))
    model = keras.Model(inp, keras.layers.Dense(1)(x))
    model.compile(optimizer=sok.optimizers.Adam(0.05), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def _batches(n: int, keys: int = 64) -> list[tuple[tf.Tensor, tf.Tensor]]:
    rng = np.random.default_rng(0)
    return [(tf.constant(rng.integers(0, keys, (8, 2))), tf.constant(rng.integers(0, 2, (8, 1)).astype("float32")))
            for _ in range(n)]


def _within(seconds: int, call):
    with _deadline(seconds):
        return call()


def _occupied(root: Path) -> Path:
    (root / "x").mkdir()
    (root / "x" / "notes.txt").write_text("")
    return root / "x"


CASES = [
    ("fit without optimizer", lambda t: fit(keras.Sequential([keras.layers.Dense(1)]), _batches(1)), ValueError,
     r"pass an optimizer"),
    ("fit max_steps 0", lambda t: fit(_model(), _batches(1), max_steps=0), ValueError, r"max_steps=0"),
    ("fit steps and epochs", lambda t: fit(_model(), _batches(1), max_steps=2, epochs=1), ValueError,
     r"max_steps or epochs"),
    ("fit keep_last 0", lambda t: fit(_model(), _batches(1), keep_last=0), ValueError, r"keep_last=0"),
    ("fit log_interval -1", lambda t: fit(_model(), _batches(1), log_interval=-1), ValueError, r"log_interval=-1"),
    ("fit eval without loader", lambda t: fit(_model(), _batches(1), eval_interval=2), ValueError,
     r"eval_interval needs an eval_loader"),
    ("fit empty loader", lambda t: _within(60, lambda: fit(_model(), [], progress=False, verbose=0)), ValueError,
     r"train_loader yielded no batches"),
    ("evaluate empty", lambda t: evaluate(_model(), []), ValueError, r"yielded no batches"),
    ("save over other files", lambda t: save_checkpoint(_occupied(t), _model(), overwrite=True), FileExistsError,
     r"path=.*did not write"),
    ("save overwrite 'no'", lambda t: save_checkpoint(t / "c", _model(), overwrite="no"), ValueError,
     r"overwrite='no' is invalid: expected True or False"),
    ("export_delta overwrite 'no'", lambda t: export_delta(_model(), t / "d", since=0, overwrite="no"), ValueError,
     r"overwrite='no' is invalid"),
    ("save empty path", lambda t: save_checkpoint("", _model()), ValueError, r"path='' is invalid"),
    ("save path None", lambda t: save_checkpoint(None, _model()), ValueError, r"path=None is invalid"),
    ("save state not JSON", lambda t: save_checkpoint(t / "c", _model(), state={"step": np.int64(3)}), ValueError,
     r"state is invalid: expected JSON values"),
    ("load tables 'no'", lambda t: load_checkpoint(t, _model(), tables="no"), ValueError,
     r"tables='no' is invalid"),
    ("load missing manifest", lambda t: load_checkpoint(t, _model()), FileNotFoundError, r"manifest\.json missing"),
    ("load_export missing", lambda t: load_export(t / "none"), FileNotFoundError, r"path=.*not an export"),
    ("profile start 0", lambda t: ProfileSteps(t, start=0), ValueError, r"start=0"),
    ("op_breakdown no trace", lambda t: op_breakdown(t), FileNotFoundError, r"log_dir_or_trace="),
    ("op_breakdown by", lambda t: op_breakdown(t, by="layer"), ValueError, r"by='layer'"),
    ("fit min_delta nan", lambda t: fit(_model(), _batches(1), min_delta=float("nan")), ValueError,
     r"min_delta=nan, expected a finite number"),
    ("export_delta since a float", lambda t: export_delta(_model(), t / "d", since=1.5), TypeError,
     r"since=1.5 is invalid: expected an export or delta directory, or a mark"),
    ("export_delta since nothing", lambda t: export_delta(_model(), t / "d", since=t), FileNotFoundError,
     r"since=.* is not an export or delta"),
    ("apply_delta to nothing", lambda t: apply_delta(t / "none", _delta(t)), FileNotFoundError,
     r"export_dir=.*none' is not an export or delta"),
    ("apply_delta from nothing", lambda t: apply_delta(t, t / "none"), FileNotFoundError,
     r"delta_dir=.*none' is not a delta"),
    ("apply_delta a checkpoint", lambda t: apply_delta(t, save_checkpoint(t / "c", _model())), ValueError,
     r"delta_dir=.* is not a delta \(manifest kind None\)"),
]


def _delta(root: Path) -> Path:
    model = _model(dynamic=True)
    table = sok.tables_of(model)[0]
    if not table.lifecycle.track_changes:  # this module's model does not track changes: one that does
        inp = keras.Input([2], dtype="int64")
        layer = sok.DistributedEmbedding("sum", 64, 3, slot_num=2, max_nnz=1, track_changes=True, name="items")
        model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(layer(inp))))
        model(np.zeros((1, 2), np.int64))
    return export_delta(model, root / "delta", since=0)


@pytest.mark.parametrize("call,error,pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused_by_name(tmp_path, call, error, pattern):
    with pytest.raises(error, match=pattern):
        call(tmp_path)


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail instead of hanging: SIGALRM interrupts a loop that spins in Python."""
    def expire(*_):
        raise TimeoutError(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_fit_stops_when_a_generator_runs_out_before_max_steps(capsys):
    """A one-pass generator of 3 batches with max_steps=10: 3 steps, a message, no spinning."""
    model = _model()
    with _deadline(120):
        history = fit(model, (b for b in _batches(3)), max_steps=10, log_interval=1, progress=False, verbose=0)
    assert history.step[-1] == 3
    assert "data ran out at step 3, before max_steps=10" in capsys.readouterr().out


def test_fit_resumed_from_its_last_snapshot_is_already_done(tmp_path):
    first = fit(_model(), _batches(3), max_steps=3, snapshot_dir=tmp_path, progress=False, verbose=0)
    again = fit(_model(), _batches(3), max_steps=3, snapshot_dir=tmp_path, progress=False, verbose=0)
    assert first.snapshots and again.resumed_from == 3 and not again.loss


def test_fit_reiterates_a_reiterable_loader_up_to_max_steps():
    history = fit(_model(), _batches(3), max_steps=7, log_interval=1, progress=False, verbose=0)
    assert history.step[-1] == 7


def test_fit_keeps_only_the_newest_snapshots(tmp_path):
    fit(_model(), _batches(4), max_steps=8, snapshot_interval=1, snapshot_dir=tmp_path, keep_last=2,
        progress=False, verbose=0)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-00000007", "step-00000008"]


def test_corrupt_manifest_names_the_file(tmp_path):
    model = _model()
    model(_batches(1)[0][0])
    save_checkpoint(tmp_path / "c", model)
    for damaged, message in ((b"{", r"not valid JSON"), (b'{"model": "\xff"}', r"not valid JSON"),
                             (b'{"tables": []}', r"lacks or mangles \['model', 'state', 'dense', 'optimizer'\]"),
                             (b"[]", r"lacks or mangles")):  # cut short, not UTF-8, fields missing, not a mapping
        (tmp_path / "c" / "manifest.json").write_bytes(damaged)
        with pytest.raises(ValueError, match=rf"manifest\.json.* {message}"):
            load_checkpoint(tmp_path / "c", model)


def test_a_dynamic_tables_checkpoint_into_a_static_table_changes_nothing(tmp_path):
    source = _model(dynamic=True)
    x = tf.constant([[2**40, 5], [7, -3]], tf.int64)  # keys no static table of 64 rows can hold
    source.fit(x, tf.ones([2, 1]), verbose=0)
    save_checkpoint(tmp_path / "c", source, source.optimizer)
    target = _model(dynamic=False)
    target.fit(*_batches(1)[0], verbose=0)
    before = [v.numpy().copy() for v in target.variables + target.optimizer.variables]
    with pytest.raises(CheckpointMismatch, match=r"table .*items.*keys span \[-3, 1099511627776\].*\[0, 64\)"):
        load_checkpoint(tmp_path / "c", target, target.optimizer)
    for v, b in zip(target.variables + target.optimizer.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def _saved(tmp_path, **kwargs):
    """(a trained model, its checkpoint, its variables as they are)."""
    model = _model(**kwargs)
    model.fit(*_batches(1)[0], verbose=0)
    path = save_checkpoint(tmp_path / "c", model, model.optimizer)
    return model, path, [v.numpy().copy() for v in model.variables + model.optimizer.variables]


def _unchanged(model, before):
    for v, b in zip(model.variables + model.optimizer.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_a_damaged_dense_file_changes_nothing(tmp_path):
    model, path, before = _saved(tmp_path)
    model.fit(*_batches(2)[1], verbose=0)
    before = [v.numpy().copy() for v in model.variables + model.optimizer.variables]
    with zipfile.ZipFile(path / "dense.npz") as archive:
        last = archive.infolist()[-1]  # (its data ends where the central directory starts)
        end = archive.start_dir
    data = bytearray((path / "dense.npz").read_bytes())
    data[end - 1] ^= 0xFF  # a flipped byte in the last array, read after the others
    (path / "dense.npz").write_bytes(bytes(data))
    assert last.file_size > 0
    with pytest.raises(CheckpointMismatch, match=r"dense\.npz cannot be read"):
        load_checkpoint(path, model, model.optimizer)
    _unchanged(model, before)


def test_a_checkpoint_of_another_table_name_changes_nothing(tmp_path):
    _, path, _ = _saved(tmp_path)
    inp = keras.Input([2], dtype="int64")
    x = keras.layers.Flatten()(sok.DistributedEmbedding("sum", 64, 3, slot_num=2, max_nnz=1, name="users")(inp))
    other = keras.Model(inp, keras.layers.Dense(1)(x))
    other.compile(optimizer=sok.optimizers.Adam(0.05), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    other.fit(*_batches(1)[0], verbose=0)
    before = [v.numpy().copy() for v in other.variables + other.optimizer.variables]
    with pytest.raises(CheckpointMismatch, match=r"table 0 was saved as items.*this model's is users"):
        load_checkpoint(path, other, other.optimizer)
    _unchanged(other, before)


def test_an_optimizer_not_built_is_refused_rather_than_skipped(tmp_path):
    model, path, _ = _saved(tmp_path)
    with pytest.raises(CheckpointMismatch, match=r"optimizer Adam is not built"):
        load_checkpoint(path, model, sok.optimizers.Adam(0.05))


def test_rows_to_save_are_checked_before_anything_is_written(tmp_path):
    model, path, _ = _saved(tmp_path)
    written = {f.name: f.read_bytes() for f in path.rglob("*") if f.is_file()}
    table = sok.embedding.tables_of(model)[0]
    for rows, pattern in [({"users": {"keys": np.arange(2), "vectors": np.zeros((2, 3))}}, r"rows names \['users'\]"),
                          ({table.name: {"keys": np.arange(2), "vectors": np.zeros((2, 9))}},
                           r"vectors has shape \(2, 9\), expected \(2, 3\)"),
                          ({table.name: {"keys": np.array([1.5])}}, r"need vectors")]:
        with pytest.raises(ValueError, match=pattern):
            save_checkpoint(path, model, model.optimizer, overwrite=True, rows=rows)
    assert {f.name: f.read_bytes() for f in path.rglob("*") if f.is_file()} == written


def test_corrupt_export_description_names_the_file(tmp_path):
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "graph.json").write_text("not json")
    with pytest.raises(ValueError, match=r"graph\.json.* not valid JSON"):
        load_export(tmp_path)


def test_loader_errors_inside_model_fit_arrive_as_invalid_argument_naming_the_file(tmp_path):
    """tf.data turns a generator's exception into InvalidArgumentError: the documented type to
    catch inside model.fit; the message still carries the LoaderError's text and file."""
    import pandas as pd

    from sok_tutorial.data import ParquetLoader, to_parquet_dataset

    frame = pd.DataFrame({"item": [0, 1, 2, 3], "label": [0.0, 1.0, 0.0, None]})
    to_parquet_dataset(frame, tmp_path / "ds", cat_names=["item"], label_names=["label"], cardinalities={"item": 4},
                       progress=False)
    loader = ParquetLoader(tmp_path / "ds", 2, ["label"], cat_names=["item"])
    inp = keras.Input([], dtype="int64", name="item")
    emb = sok.All2AllDenseEmbedding(8, 2, 1, 1, dynamic_input=True, use_hashtable=False)(inp)
    model = keras.Model({"item": inp}, keras.layers.Dense(1)(emb))
    model.compile(optimizer="sgd", loss="mse")
    message = r"LoaderError: column 'label' of '.*ds/part-00000\.parquet' has 1 nulls"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        model.fit(loader, epochs=1, verbose=0)
