"""`fit` prints its log lines (or nothing), and trains, snapshots and resumes a plain Keras model."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from data_gen.movielens import generate_movielens  # noqa: E402
from sok_tutorial.data import ParquetLoader, Workflow, split_rows, to_parquet_dataset  # noqa: E402
from sok_tutorial.training import evaluate, export_model, fit, load_export  # noqa: E402
from sok_tutorial.training.loop import predictor  # noqa: E402
from sok_tutorial.training.metrics import roc_auc  # noqa: E402
from tests.training.resume import straight_and_resumed  # noqa: E402

IDS = ["userId", "movieId"]


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    ml = generate_movielens(3000, num_users=60, num_movies=50, seed=1)
    train, valid = split_rows(ml.ratings, valid_fraction=0.2, by="time")
    workflow = Workflow(cat_names=IDS, label=("rating", 4.0), label_name="liked").fit(train)
    for name, rows in (("train", train), ("valid", valid)):
        to_parquet_dataset(workflow.transform(rows), root / name, **workflow.column_kinds(), row_group_size=512,
                           progress=False)
    return root, workflow, valid


def _loaders(root):
    return (ParquetLoader(root / "train", 128, ["liked"], cat_names=IDS, seed=2),
            ParquetLoader(root / "valid", 512, ["liked"], cat_names=IDS, shuffle=False))


class PlainModel(keras.Model):
    """Only stock Keras: one ``keras.layers.Embedding`` per id, concatenated, two Dense layers."""

    def __init__(self, cardinalities, **kwargs):
        super().__init__(**kwargs)
        self.tables = {n: keras.layers.Embedding(cardinalities[n], 6, name=f"embedding_{n}") for n in IDS}
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.logit = keras.layers.Dense(1, name="logit")

    def call(self, features, training=None):
        x = tf.concat([self.tables[n](tf.reshape(features[n], [-1])) for n in IDS], axis=1)  # (B, 12)
        return self.logit(self.hidden(x))  # (B, 1)


def _plain(workflow):
    model = PlainModel(workflow.categorify.cardinalities)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def test_verbose_prints_log_and_eval_lines_and_verbose_false_prints_none(ratings, capsys):
    root, workflow, _ = ratings
    for progress in (False, True):
        train, valid = _loaders(root)
        keras.utils.set_random_seed(0)
        fit(_plain(workflow), train, eval_loader=valid, eval_interval=4, max_steps=8, log_interval=2,
            progress=progress)
        lines = capsys.readouterr().out.splitlines()
        logs = [line for line in lines if re.fullmatch(r"step \d+: loss \d+\.\d{4}, [\d,]+ samples/s", line)]
        evals = [line for line in lines
                 if re.fullmatch(r"step \d+: eval auc \d\.\d{4}, loss \d+\.\d{4}( \(best so far\))?", line)]
        assert [line.split(":")[0] for line in logs] == ["step 2", "step 4", "step 6", "step 8"], lines
        assert [line.split(":")[0] for line in evals] == ["step 4", "step 8"], lines
        assert evals[0].endswith("(best so far)")  # the first evaluation is always the best yet
        assert len(lines) == 6, lines  # nothing else on stdout; the bar stays on stderr
    for quiet in (False, 0):
        train, valid = _loaders(root)
        fit(_plain(workflow), train, eval_loader=valid, eval_interval=4, max_steps=8, log_interval=2,
            progress=False, verbose=quiet)
        assert capsys.readouterr().out == ""


def test_fit_trains_snapshots_and_resumes_a_plain_keras_model(tmp_path, ratings):
    root, workflow, valid_rows = ratings
    train, valid = _loaders(root)
    (_, full, weights_full, _), (first, resumed, weights_resumed, model) = straight_and_resumed(
        tmp_path, lambda: _plain(workflow), lambda: _loaders(root), 7, evaluate=True, max_steps=2 * len(train),
        snapshot_interval=10, log_interval=1)
    assert first.snapshots == [str(tmp_path / "snaps-True" / "step-00000007")]
    assert full.resumed_from is None and resumed.resumed_from == 7
    assert resumed.step[0] == 8 and resumed.step[-1] == 2 * len(train)
    np.testing.assert_allclose(resumed.loss, full.loss[7:], rtol=1e-5)
    for a, b in zip(weights_full, weights_resumed):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert full.loss[-1] < full.loss[0] and resumed.eval_auc[-1] > 0.5
    assert resumed.snapshots[-1].endswith(f"step-{2 * len(train):08d}")

    features, _ = next(iter(valid))
    export_model(model, workflow, tmp_path / "export", sample=features)
    graph = json.loads((tmp_path / "export" / "graph.json").read_text())
    cards = workflow.categorify.cardinalities
    assert graph["tables"] == [{"layer": f"embedding_{n}", "rows": cards[n], "dim": 6} for n in IDS]
    expected = tf.sigmoid(model(features, training=False)).numpy().ravel()
    got = load_export(tmp_path / "export").predict({n: valid_rows[n][:len(expected)] for n in IDS})
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_evaluations_trace_the_model_once_and_see_the_weights_of_the_moment(ratings):
    """Evaluating every few steps reuses one trace of the forward pass (`predictor`), yet each
    evaluation sees the weights as they are then: the last one equals an eager pass of the trained
    model; a model with other variables gets a trace of its own."""
    root, workflow, _ = ratings
    train, valid = _loaders(root)
    keras.utils.set_random_seed(0)
    model = _plain(workflow)
    history = fit(model, train, eval_loader=valid, eval_interval=2, max_steps=8, progress=False, verbose=False)
    assert len(history.eval_auc) == 4 and len(set(history.eval_auc)) > 1  # the weights moved between them
    assert 1 <= predictor(model).experimental_get_tracing_count() <= 2  # one trace (two: a shorter last batch)
    scores = np.concatenate([model(f, training=False).numpy().ravel() for f, _ in valid])
    labels = np.concatenate([np.asarray(y).ravel() for _, y in valid])
    assert evaluate(model, valid)["auc"] == pytest.approx(roc_auc(labels, scores), abs=1e-9)
    assert 1 <= predictor(model).experimental_get_tracing_count() <= 2
    other = _plain(workflow)
    other(next(iter(valid))[0])  # built: variables of its own
    assert predictor(other) is not predictor(model)
