from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from data_gen.movielens import generate_movielens  # noqa: E402
from sok_tutorial.data import ParquetLoader, Workflow, split_rows, to_parquet_dataset  # noqa: E402
from sok_tutorial.models import EmbeddingMLP  # noqa: E402
from sok_tutorial.training import (  # noqa: E402
    CheckpointMismatch,
    ThroughputLogger,
    evaluate,
    export_model,
    fit,
    latest_checkpoint,
    load_checkpoint,
    load_export,
    model_summary,
    parameter_report,
    save_checkpoint,
)
from tests.training.resume import straight_and_resumed  # noqa: E402

WORKFLOW = dict(cat_names=["userId", "movieId"], list_names=["genres"], label=("rating", 4.0), label_name="liked")


@pytest.fixture(scope="module")
def movielens(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml")
    ml = generate_movielens(30_000, num_users=300, num_movies=200, seed=0)
    train, valid = split_rows(ml.ratings, valid_fraction=0.2, by="time")
    workflow = Workflow(**WORKFLOW).fit(train)
    for name, rows in (("train", train), ("valid", valid)):
        to_parquet_dataset(workflow.transform(rows), root / name, **workflow.column_kinds(), row_group_size=2048,
                           progress=False)
    return root, workflow, ml, valid


def _loaders(root, batch=512):
    kinds = dict(label_names=["liked"], cat_names=["userId", "movieId"], list_names=["genres"])
    return (ParquetLoader(root / "train", batch, seed=1, **kinds),
            ParquetLoader(root / "valid", 2048, shuffle=False, **kinds))


def _model(workflow):
    cards = {n: c for n, c in workflow.categorify.cardinalities.items()}
    model = EmbeddingMLP(cards, dims=8, multi_hot=["genres"], hidden=[32, 16])
    model.compile(optimizer=sok.optimizers.Adam(0.01))
    return model


def test_workflow_round_trip_and_oov(tmp_path, movielens):
    _, workflow, ml, valid = movielens
    workflow.save(tmp_path / "wf")
    loaded = Workflow.load(tmp_path / "wf")
    assert loaded.transform(valid).equals(workflow.transform(valid))
    new = pa.table({"userId": pa.array([1, 10**9], pa.int64()), "movieId": pa.array([1, -5], pa.int64()),
                    "genres": pa.array([["Drama", "Nope"], []]), "rating": pa.array([5.0, 1.0], pa.float32())})
    out = loaded.transform(new)
    assert out["userId"][1].as_py() == 0 and out["movieId"][1].as_py() == 0  # unseen -> OOV row
    assert out["genres"][0].as_py()[1] == 0 and out["liked"].to_pylist() == [1, 0]
    schema = loaded.output_schema
    assert schema["userId"].cardinality == workflow.categorify.cardinalities["userId"]
    assert [c.kind for c in schema.columns] == ["categorical", "categorical", "list", "label"]
    assert set(loaded.embedding_sizes()) == {"userId", "movieId", "genres"}
    sizes = schema.metadata["embedding_sizes"]
    assert sizes["userId"][0] == schema["userId"].cardinality and sizes["userId"][1] >= 1
    assert sizes == {k: list(v) for k, v in loaded.embedding_sizes().items()}
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['movieId'\]"):
        loaded.transform(new.drop(["movieId"]))
    with pytest.raises(TypeError, match="'userId' holds string"):
        loaded.transform(new.set_column(0, "userId", pa.array(["a", "b"])))
    with pytest.raises(FileNotFoundError, match="no saved Workflow"):
        Workflow.load(tmp_path)


def test_split_by_time_puts_later_rows_in_valid(movielens):
    _, _, ml, _ = movielens
    train, valid = split_rows(ml.ratings, valid_fraction=0.25, by="time")
    assert valid.num_rows == 7500 and pc.max(train["timestamp"]).as_py() <= pc.min(valid["timestamp"]).as_py()
    a, b = split_rows(ml.ratings, valid_fraction=0.25, by="random", seed=3)
    assert a.num_rows + b.num_rows == 30_000


def test_fit_learns_logs_and_evaluates(tmp_path, movielens):
    root, workflow, _, _ = movielens
    train, valid = _loaders(root)
    keras.utils.set_random_seed(0)
    model = _model(workflow)
    throughput = ThroughputLogger(512, every=5)
    history = fit(model, train, eval_loader=valid, eval_interval=20, epochs=2, log_interval=10,
                  log_dir=tmp_path / "tb", callbacks=[throughput], progress=False)
    assert history.step[-1] == 2 * len(train) and history.eval_step[-1] == history.step[-1]
    assert history.eval_auc[-1] > history.eval_auc[0] and history.eval_auc[-1] > 0.65
    assert all(r > 0 for r in history.samples_per_s) and throughput.history
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"loss", "samples_per_s", "eval_auc"} <= set(events.Tags()["tensors"])


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, movielens):
    root, workflow, _, _ = movielens
    (_, full, weights_full, _), (_, resumed, weights_resumed, _) = straight_and_resumed(
        tmp_path, lambda: _model(workflow), lambda: _loaders(root), 35, max_steps=80, snapshot_interval=40,
        log_interval=1)
    assert resumed.resumed_from == 35
    np.testing.assert_allclose(resumed.loss, full.loss[35:], rtol=1e-5)
    for a, b in zip(weights_full, weights_resumed):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_checkpoint_is_atomic_and_refuses_another_model(tmp_path, movielens):
    root, workflow, _, _ = movielens
    train, valid = _loaders(root)
    model = _model(workflow)
    fit(model, train, max_steps=5, progress=False)
    save_checkpoint(tmp_path / "step-00000005", model, model.optimizer, state={"step": 5})
    (tmp_path / ".step-00000009.tmp-abc").mkdir()  # what a crash mid-save leaves behind
    assert latest_checkpoint(tmp_path).name == "step-00000005"
    other = EmbeddingMLP(workflow.categorify.cardinalities, dims=4, multi_hot=["genres"], hidden=[32, 16])
    other(next(iter(valid))[0])
    with pytest.raises(CheckpointMismatch, match="width 8 vs 4"):
        load_checkpoint(tmp_path / "step-00000005", other)
    fresh = _model(workflow)
    fresh(next(iter(valid))[0])
    fresh.optimizer.build(fresh.trainable_variables)
    assert load_checkpoint(tmp_path / "step-00000005", fresh, fresh.optimizer) == {"step": 5}
    batch = next(iter(valid))[0]
    np.testing.assert_array_equal(fresh(batch).numpy(), model(batch).numpy())
    with pytest.raises(FileNotFoundError, match="manifest.json missing"):
        load_checkpoint(tmp_path / ".step-00000009.tmp-abc", fresh)


@pytest.mark.parametrize("dynamic", [False, True], ids=["row-ids", "dynamic-vocabulary"])
def test_export_round_trip_is_exact_and_checks_inputs(tmp_path, movielens, dynamic):
    root, workflow, ml, valid = movielens
    train, valid_loader = _loaders(root)
    model = EmbeddingMLP(workflow.categorify.cardinalities, dims=8, multi_hot=["genres"], hidden=[32, 16],
                         use_hashtable=dynamic)
    model.compile(optimizer=sok.optimizers.Adam(0.01))
    fit(model, train, max_steps=30, progress=False)
    raw = valid.slice(0, 300)
    features, _ = next(iter(ParquetLoader(root / "valid", 300, ["liked"], cat_names=["userId", "movieId"],
                                          list_names=["genres"], shuffle=False)))
    expected = tf.sigmoid(model(features, training=False)).numpy().ravel()
    export_model(model, workflow, tmp_path / "export", sample=features)
    predictor = load_export(tmp_path / "export")
    got = predictor.predict({"userId": raw["userId"], "movieId": raw["movieId"], "genres": raw["genres"]})
    assert np.abs(got - expected).max() < 1e-6
    graph = json.loads((tmp_path / "export" / "graph.json").read_text())
    assert graph["inputs"] == {"userId": "int64", "movieId": "int64", "genres": "string"}
    assert any(layer["kind"] == "embedding" for layer in graph["layers"])
    cards = workflow.categorify.cardinalities
    assert graph["tables"] == [{"layer": f"embedding_{n}", "rows": cards[n], "dim": 8}
                               for n in ("userId", "movieId", "genres")]
    one = predictor.predict([{"userId": 1, "movieId": 1, "genres": "Drama|Comedy"}])
    assert one.shape == (1,) and 0 < one[0] < 1
    with pytest.raises(ValueError, match=r"missing column\(s\) \['genres'\]"):
        predictor.predict([{"userId": 1, "movieId": 1}])
    with pytest.raises(ValueError, match="column 'userId': got string values, expected int64"):
        predictor.predict([{"userId": "alice", "movieId": 1, "genres": "Drama"}])


def test_summary_and_parameter_report(movielens):
    root, workflow, _, _ = movielens
    model = _model(workflow)
    batch = next(iter(_loaders(root)[1]))[0]
    lines = []
    rows = model_summary(model, batch, print_fn=lines.append)
    kinds = {r["layer"]: r["kind"] for r in rows}
    assert kinds["embedding_userId"] == "embedding" and kinds["logit"] == "dense"
    assert next(r for r in rows if r["layer"] == "logit")["outputs"] == "(2048, 1)"
    report = parameter_report(model)
    cards = workflow.categorify.cardinalities
    assert report["embedding_parameters"] == 8 * sum(cards.values())
    assert report["dense_parameters"] == (3 * 8 * 32 + 32) + (32 * 16 + 16) + (16 + 1)
    assert "embedding parameters" in lines[-1]


def test_fit_bad_arguments():
    with pytest.raises(ValueError, match="pass an optimizer"):
        fit(keras.Sequential([keras.layers.Dense(1)]), [], progress=False)
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(optimizer="adam")
    with pytest.raises(ValueError, match="max_steps or epochs, not both"):
        fit(model, [], max_steps=1, epochs=1, progress=False)
    with pytest.raises(ValueError, match="snapshot_interval needs a snapshot_dir"):
        fit(model, [], snapshot_interval=5, progress=False)
    with pytest.raises(ValueError, match="evaluation loader yielded no batches"):
        evaluate(model, [])


def test_checkpoint_loads_into_a_second_instance_with_other_auto_names(tmp_path):
    """Keras numbers unnamed layers per process (dense, dense_1, ...): a checkpoint of one
    instance loads into another built later in the same process, matched by name and shape."""
    import sok_tutorial as sok

    def build(hidden: int) -> keras.Model:
        inp = keras.Input([3], dtype="int64")
        x = keras.layers.Flatten()(sok.DistributedEmbedding("sum", 50, 4, slot_num=3, max_nnz=1)(inp))
        out = keras.layers.Dense(1)(keras.layers.Dropout(0.1)(keras.layers.Dense(hidden, activation="relu")(x)))
        return keras.Model(inp, out)

    keys = np.array([[1, 2, 3], [40, 2, 9]])
    first = build(8)
    first(keys)
    save_checkpoint(tmp_path / "ckpt", first)
    second = build(8)
    second(keys[:1])
    assert {v.path.split("/")[-2] for v in second.variables} != {v.path.split("/")[-2] for v in first.variables}
    load_checkpoint(tmp_path / "ckpt", second)
    np.testing.assert_array_equal(second(keys).numpy(), first(keys).numpy())
    other = build(16)
    other(keys)
    with pytest.raises(CheckpointMismatch, match=r"only in the save: dense/kernel \[12, 8\]"):
        load_checkpoint(tmp_path / "ckpt", other)
