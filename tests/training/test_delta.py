"""Delta exports: a chain of deltas applied to a first export equals a full export of the latest
model, a server loading it predicts as the trainer, and a delta that does not fit is refused
before anything changes."""
from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial.training import checkpoint
from sok_tutorial.training.delta import apply_delta, export_delta, export_model_tables


def make_model(policy: str | None = "lru", track: bool = False) -> keras.Model:
    keys = keras.Input((2,), dtype="int64")
    options = {"eviction_policy": policy, "evict_fraction": 0.25} if policy else {"track_changes": track}
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
    with pytest.raises(FileNotFoundError):
        apply_delta(tmp_path / "serving", first)
    after = {p.name: p.read_bytes() for p in (tmp_path / "serving").rglob("*") if p.is_file()}
    assert after == before
    apply_delta(tmp_path / "serving", export_delta(model, tmp_path / "d_all", since=tmp_path / "serving"))
    marks = json.loads((tmp_path / "serving" / "manifest.json").read_text())["state"]["export"]["marks"]
    assert marks == [sok.tables_of(model)[0]._clock.numpy()]


def test_a_table_without_tracking_cannot_export_deltas(tmp_path):
    model = make_model(policy=None, track=False)
    model.predict(day(0)[0][:1], verbose=0)
    with pytest.raises(ValueError, match="does not track changes: build it with track_changes=True"):
        export_delta(model, tmp_path / "d", since=0)
    assert not (tmp_path / "d").exists()
