"""Delta exports: a chain of deltas applied to a first export equals a full export of the latest
model, a server loading it predicts as the trainer, and a delta that does not fit is refused
before anything changes."""
from __future__ import annotations

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.embedding import lifecycle, tables_of
from sok_tutorial.training import checkpoint
from sok_tutorial.training.delta import DeltaError, apply_delta, export_delta, export_model_tables


def make_model(policy: str | None = "lru", track: bool = False) -> keras.Model:
    keys = keras.Input((2,), dtype="int64")
    options = {"eviction_policy": policy, "eviction_log": 4096} if policy else {"track_changes": track}
    emb = sok.DistributedEmbedding("sum", 40, 4, slot_num=2, max_nnz=1, name="emb", **options)
    out = keras.layers.Dense(1, name="head")(keras.layers.Flatten()(emb(keys)))
    model = keras.Model(keys, out)
    model.compile(optimizer=sok.optimizers.Adam(0.05), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def day(t: int, n: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Keys drifting by 15 a day: each day brings keys the 40-row table has not seen."""
    rng = np.random.default_rng(t)
    keys = rng.integers(0, 30, (n, 2)) + 15 * t
    return keys.astype(np.int64), (keys.sum(1) % 3 == 0).astype(np.float32)[:, None]


def by_key(arrays: dict) -> dict:
    order = np.argsort(arrays["keys"])
    return {name: np.asarray(arrays[name])[order] for name in ("keys", "vectors")}


def test_a_chain_of_deltas_equals_a_full_export_and_serves_as_the_trainer(tmp_path):
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    export_model_tables(model, tmp_path / "serving")
    previous, evicted = tmp_path / "serving", 0
    for t in range(1, 5):
        model.fit(*day(t), batch_size=64, verbose=0)
        delta = export_delta(model, tmp_path / f"delta{t}", since=previous)
        evicted += apply_delta(tmp_path / "serving", delta)["emb/emb"]["evicted"]  # (layer / its table)
        previous = delta
    assert evicted > 0  # the chain really carried evictions
    export_model_tables(model, tmp_path / "full")
    served, full = checkpoint.read_tables(tmp_path / "serving")[0], checkpoint.read_tables(tmp_path / "full")[0]
    for name, value in by_key(full).items():
        np.testing.assert_array_equal(by_key(served)[name], value)
    server = make_model()
    server.predict(day(0)[0][:1], verbose=0)  # builds it
    checkpoint.load_checkpoint(tmp_path / "serving", server)
    keys = np.concatenate([day(t)[0] for t in range(5)])  # evicted, held and never-seen keys alike
    np.testing.assert_allclose(server.predict(keys, verbose=0), model.predict(keys, verbose=0), atol=1e-6)


def test_a_delta_holds_only_the_rows_changed_since_its_base(tmp_path):
    model = make_model(policy=None, track=True)
    model.fit(*day(0), batch_size=64, verbose=0)
    export_model_tables(model, tmp_path / "base")
    table = sok.tables_of(model)[0]
    table(tf.constant([[3, 5]], tf.int64), training=True)
    delta = export_delta(model, tmp_path / "d", since=tmp_path / "base")
    saved = np.load(delta / "tables" / "0.npz")
    assert sorted(saved["keys"].tolist()) == [3, 5] and len(saved["evicted"]) == 0


def test_a_delta_applied_out_of_order_or_to_another_model_is_refused_and_changes_nothing(tmp_path):
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    export_model_tables(model, tmp_path / "serving")
    model.fit(*day(1), batch_size=64, verbose=0)
    first = export_delta(model, tmp_path / "d1", since=tmp_path / "serving")
    model.fit(*day(2), batch_size=64, verbose=0)
    second = export_delta(model, tmp_path / "d2", since=first)
    before = {p.name: p.read_bytes() for p in (tmp_path / "serving").rglob("*") if p.is_file()}
    with pytest.raises(checkpoint.CheckpointMismatch, match="starts after mark .* changes in between are missing"):
        apply_delta(tmp_path / "serving", second)
    keys = keras.Input((2,), dtype="int64")
    wide = sok.DistributedEmbedding("sum", 40, 8, slot_num=2, max_nnz=1, name="emb", track_changes=True)
    other = keras.Model(keys, keras.layers.Dense(1, name="head")(keras.layers.Flatten()(wide(keys))))
    wide(tf.constant([[1, 2]], tf.int64), training=True)
    export_delta(other, tmp_path / "d_other", since=0)
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"table emb/emb \(width 8\) vs emb/emb \(width 4\)"):
        apply_delta(tmp_path / "serving", tmp_path / "d_other")
    (first / "tables" / "0.npz").unlink()  # a damaged delta
    with pytest.raises(DeltaError, match=r"0.npz is missing"):
        apply_delta(tmp_path / "serving", first)
    after = {p.name: p.read_bytes() for p in (tmp_path / "serving").rglob("*") if p.is_file()}
    assert after == before
    apply_delta(tmp_path / "serving", export_delta(model, tmp_path / "d_all", since=tmp_path / "serving"))
    marks = json.loads((tmp_path / "serving" / "manifest.json").read_text())["state"]["export"]["marks"]
    assert marks == [sok.tables_of(model)[0].state.mark()]


def test_a_table_without_tracking_cannot_export_deltas(tmp_path):
    model = make_model(policy=None, track=False)
    model.predict(day(0)[0][:1], verbose=0)
    with pytest.raises(ValueError, match="does not track changes: build it with track_changes=True"):
        export_delta(model, tmp_path / "d", since=0)
    assert not (tmp_path / "d").exists()


def test_a_delta_from_a_mark_the_tables_have_not_reached_is_refused(tmp_path):
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    reached = lifecycle.mark(tables_of(model)[0])
    with pytest.raises(ValueError, match=rf"since={reached + 1} is invalid: table .* has reached mark {reached}"):
        export_delta(model, tmp_path / "d", since=reached + 1)
    assert not (tmp_path / "d").exists()
    for bad in (-1, np.int64(-5)):  # not a clock reading: named as such, not as a gap in the eviction log
        with pytest.raises(ValueError, match=r"since=.*-[15].* is invalid: expected a mark >= 0"):
            export_delta(model, tmp_path / "d", since=bad)
        with pytest.raises(ValueError, match=r"since=.*-[15].* is invalid: expected a mark >= 0"):
            tables_of(model)[0].export(since=bad)
    assert not (tmp_path / "d").exists()
    export_delta(model, tmp_path / "d", since=reached)  # nothing changed since: an empty delta
    assert (tmp_path / "d").exists()


def _served(root):
    """An export of a trained model and a delta after one more day; (model, export, delta)."""
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    export_model_tables(model, root / "serving")
    model.fit(*day(1), batch_size=64, verbose=0)
    return model, root / "serving", export_delta(model, root / "d1", since=root / "serving")


@pytest.fixture(scope="module")
def served_once(tmp_path_factory):
    """`_served` once for the module's tests that only read the model: (model, folder holding
    ``serving`` and ``d1``)."""
    root = tmp_path_factory.mktemp("served")
    return _served(root)[0], root


@pytest.fixture
def served(tmp_path, served_once):
    """This test's own copy of `served_once`'s export and delta: (model, export, delta)."""
    model, root = served_once
    for name in ("serving", "d1"):
        shutil.copytree(root / name, tmp_path / name, symlinks=True)
    return model, tmp_path / "serving", tmp_path / "d1"


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


CORRUPT_TABLE = [  # (name, change to tables/0.npz, message)
    ("a key more than vectors", lambda a: {**a, "keys": np.append(a["keys"], 10**6)}, r"vectors is float32 of shape"),
    ("a repeated key", lambda a: {**a, "keys": np.concatenate([a["keys"][:1], a["keys"][:-1]])}, r"appear twice"),
    ("float keys", lambda a: {**a, "keys": a["keys"].astype(np.float64)}, r"keys is float64 .* integer"),
    ("NaN vectors", lambda a: {**a, "vectors": np.where(np.arange(len(a["keys"]))[:, None] == 0, np.nan,
                                                        a["vectors"])}, r"1 vector\(s\) hold NaN"),
    ("narrower vectors", lambda a: {**a, "vectors": a["vectors"][:, :3]}, r"expected floats of shape"),
    ("a short marks array", lambda a: {**a, "marks": a["marks"][:-1]}, r"marks has shape"),
    ("unsigned keys", lambda a: {**a, "keys": a["keys"].astype(np.uint64)}, r"keys are uint64, expected signed"),
    ("float marks", lambda a: {**a, "marks": a["marks"].astype(np.float64)}, r"marks is float64, the export's int64"),
    ("marks past the delta's mark", lambda a: {**a, "marks": a["marks"] + 10**12}, r"past the delta's own mark"),
    ("no evicted array", lambda a: {k: v for k, v in a.items() if k != "evicted"}, r"no 'evicted' array"),
]


@pytest.mark.parametrize("change, message", [c[1:] for c in CORRUPT_TABLE], ids=[c[0] for c in CORRUPT_TABLE])
def test_a_delta_whose_arrays_disagree_is_refused_and_the_export_still_loads(served, change, message):
    model, serving, delta = served
    arrays = dict(np.load(delta / "tables" / "0.npz"))
    np.savez(delta / "tables" / "0.npz", **change(arrays))
    before = _files(serving)
    with pytest.raises(DeltaError, match=rf"delta .*d1.*table emb/emb: .*{message}"):
        apply_delta(serving, delta)
    assert _files(serving) == before
    checkpoint.load_checkpoint(serving, make_model())  # what is published always loads


def _rewrite_manifest(delta, edit):
    manifest = json.loads((delta / "manifest.json").read_text())
    (delta / "manifest.json").write_text(json.dumps(edit(manifest)))


DAMAGED = [
    ("truncated table", lambda d: (d / "tables" / "0.npz").write_bytes((d / "tables" / "0.npz").read_bytes()[:60]),
     r"tables/0.npz|0.npz cannot be read .*damaged"),
    ("empty dense", lambda d: (d / "dense.npz").write_bytes(b""), r"dense.npz cannot be read"),
    ("dense of another shape", lambda d: np.savez(d / "dense.npz", v0=np.zeros((3, 3), np.float32),
                                                  v1=np.zeros(1, np.float32)), r"dense variable .* shape"),
    ("manifest without tables", lambda d: _rewrite_manifest(d, lambda m: {k: v for k, v in m.items() if k != "tables"}),
     r"manifest.json lacks a table"),
    ("manifest with a bad entry", lambda d: _rewrite_manifest(d, lambda m: {**m, "tables": [7]}),
     r"manifest.json lacks a table .* or one is malformed"),
    ("manifest miscounting keys", lambda d: _rewrite_manifest(
        d, lambda m: {**m, "tables": [{**m["tables"][0], "keys": m["tables"][0]["keys"] + 1}]}),
     r"the manifest counts"),
]


@pytest.mark.parametrize("damage, message", [c[1:] for c in DAMAGED], ids=[c[0] for c in DAMAGED])
def test_a_damaged_delta_is_refused_naming_it(served, damage, message):
    _, serving, delta = served
    damage(delta)
    before = _files(serving)
    with pytest.raises(DeltaError, match=message) as info:
        apply_delta(serving, delta)
    assert str(delta) in str(info.value) and _files(serving) == before


def test_an_export_reached_through_a_symlink_is_updated_where_it_points(tmp_path, served):
    model, serving, delta = served
    (tmp_path / "current").symlink_to(serving)
    apply_delta(tmp_path / "current", delta)
    assert (tmp_path / "current").is_symlink() and (tmp_path / "current").resolve() == serving.resolve()
    export_model_tables(model, tmp_path / "full")
    served, full = checkpoint.read_tables(serving)[0], checkpoint.read_tables(tmp_path / "full")[0]
    np.testing.assert_array_equal(by_key(served)["vectors"], by_key(full)["vectors"])


def test_one_process_at_a_time_applies_deltas_to_an_export(served):
    from sok_tutorial.training.delta import _export_lock

    _, serving, delta = served
    before = _files(serving)
    with _export_lock(serving.resolve(), timeout=1):
        with pytest.raises(TimeoutError, match=r"another process has been applying a delta"):
            apply_delta(serving, delta, lock_timeout=0.2)
        assert _files(serving) == before
    assert apply_delta(serving, delta)["emb/emb"]["changed"] > 0


@pytest.mark.multiprocess
def test_two_processes_applying_one_chain_leave_a_complete_export(tmp_path):
    """Both apply d1 then d2 at once: each apply either goes through or is refused as older than
    the export; the export ends equal to a full export of the latest model."""
    import subprocess
    import sys

    model, serving, d1 = _served(tmp_path)
    model.fit(*day(2), batch_size=64, verbose=0)
    d2 = export_delta(model, tmp_path / "d2", since=d1)
    export_model_tables(model, tmp_path / "full")
    script = (f"import sys; sys.path.insert(0, {str(tmp_path.parents[0])!r})\n"
              "from sok_tutorial.training import checkpoint\n"
              "from sok_tutorial.training.delta import apply_delta\n"
              f"for d in ({str(d1)!r}, {str(d2)!r}):\n"
              "    try:\n"
              f"        apply_delta({str(serving)!r}, d)\n"
              "    except checkpoint.CheckpointMismatch as exc:\n"
              "        assert 'older than the export' in str(exc), exc\n")
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    served, full = checkpoint.read_tables(serving)[0], checkpoint.read_tables(tmp_path / "full")[0]
    for name, value in by_key(full).items():
        np.testing.assert_array_equal(by_key(served)[name], value)


def test_a_trainer_restored_from_a_checkpoint_continues_its_chain_of_deltas(tmp_path):
    """The eviction log is saved with the checkpoint: after a restore, a delta since the last one
    still carries every key evicted since, and the chain equals a full export."""
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    export_model_tables(model, tmp_path / "serving")
    model.fit(*day(1), batch_size=64, verbose=0)
    apply_delta(tmp_path / "serving", export_delta(model, tmp_path / "d1", since=tmp_path / "serving"))
    model.fit(*day(2), batch_size=64, verbose=0)  # evictions after d1, before the save
    checkpoint.save_checkpoint(tmp_path / "ckpt", model, model.optimizer)
    resumed = make_model()
    resumed.predict(day(0)[0][:1], verbose=0)
    resumed.optimizer.build(resumed.trainable_variables)
    checkpoint.load_checkpoint(tmp_path / "ckpt", resumed, resumed.optimizer)
    resumed.fit(*day(3), batch_size=64, verbose=0)
    summary = apply_delta(tmp_path / "serving", export_delta(resumed, tmp_path / "d2", since=tmp_path / "d1"))
    assert summary["emb/emb"]["evicted"] > 0
    export_model_tables(resumed, tmp_path / "full")
    served, full = checkpoint.read_tables(tmp_path / "serving")[0], checkpoint.read_tables(tmp_path / "full")[0]
    for name, value in by_key(full).items():
        np.testing.assert_array_equal(by_key(served)[name], value)


def test_a_delta_of_another_trainers_export_is_refused(tmp_path):
    """Two trainers with the same layers: each export starts a lineage that its deltas carry, so a
    delta of the second cannot merge into the first's export (rows of both would serve)."""
    first, second = make_model(), make_model()
    for model, name in ((first, "e1"), (second, "e2")):
        model.fit(*day(0), batch_size=64, verbose=0)
        export_model_tables(model, tmp_path / name)
    second.fit(*day(1), batch_size=64, verbose=0)
    foreign = export_delta(second, tmp_path / "d2", since=tmp_path / "e2")
    before = _files(tmp_path / "e1")
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"continues export lineage [0-9a-f]{32}, this export is "
                                                            r"lineage [0-9a-f]{32}"):
        apply_delta(tmp_path / "e1", foreign)
    assert _files(tmp_path / "e1") == before
    apply_delta(tmp_path / "e2", foreign)  # its own export takes it, and keeps its lineage for the next one
    second.fit(*day(2), batch_size=64, verbose=0)
    apply_delta(tmp_path / "e2", export_delta(second, tmp_path / "d3", since=foreign))
    lineages = {json.loads((tmp_path / n / "manifest.json").read_text())["state"]["export"]["lineage"]
                for n in ("e1", "e2")}
    assert len(lineages) == 2


def test_a_checkpoint_whose_per_key_arrays_disagree_is_refused_before_anything_changes(tmp_path):
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    checkpoint.save_checkpoint(tmp_path / "ckpt", model)
    arrays = dict(np.load(tmp_path / "ckpt" / "tables" / "0.npz"))
    np.savez(tmp_path / "ckpt" / "tables" / "0.npz", **{**arrays, "marks": arrays["marks"][:-1]})
    other = make_model()
    other.fit(*day(1), batch_size=64, verbose=0)
    before = [v.numpy().copy() for v in other.variables]
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"marks has shape \(\d+,\), expected \(\d+,\): one "
                                                            r"per key"):
        checkpoint.load_checkpoint(tmp_path / "ckpt", other)
    for v, b in zip(other.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)


def test_apply_delta_to_a_missing_export_or_with_a_bad_timeout_leaves_no_lock_file(tmp_path, served):
    _, serving, delta = served
    with pytest.raises(FileNotFoundError, match=r"export_dir=.*nothere' is not an export"):
        apply_delta(tmp_path / "nothere", delta)
    with pytest.raises(ValueError, match=r"lock_timeout=None is invalid"):
        apply_delta(serving, delta, lock_timeout=None)
    assert not list(tmp_path.glob(".nothere*"))


def test_a_damaged_lifecycle_file_is_refused_before_any_row_is_restored(tmp_path):
    model = make_model()
    model.fit(*day(0), batch_size=64, verbose=0)
    checkpoint.save_checkpoint(tmp_path / "ckpt", model)
    kept = tmp_path / "ckpt" / "tables" / "0.lifecycle.npz"
    kept.write_bytes(kept.read_bytes()[:40])
    other = make_model()
    other.fit(*day(1), batch_size=64, verbose=0)
    before = [v.numpy().copy() for v in other.variables]
    with pytest.raises(checkpoint.CheckpointMismatch, match=r"0.lifecycle.npz cannot be read"):
        checkpoint.load_checkpoint(tmp_path / "ckpt", other)
    for v, b in zip(other.variables, before):
        np.testing.assert_array_equal(v.numpy(), b)
