"""`fit` stops when validation stops improving and gives back the best weights; `roc_auc` is the
pairwise definition; models' regularisation losses are trained on."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import sok_tutorial as sok  # noqa: E402
from data_gen.movielens import generate_movielens  # noqa: E402
from sok_tutorial.data import ParquetLoader, Workflow, split_rows, to_parquet_dataset  # noqa: E402
from sok_tutorial.models import EmbeddingMLP  # noqa: E402
from sok_tutorial.training import evaluate, fit  # noqa: E402
from sok_tutorial.training.metrics import AucAccumulator, roc_auc  # noqa: E402

IDS = ["userId", "movieId"]


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    """Few ratings per id: a wide model with a large step size overfits them within a few epochs."""
    root = tmp_path_factory.mktemp("early")
    ml = generate_movielens(4000, num_users=300, num_movies=200, seed=3)
    train, valid = split_rows(ml.ratings, valid_fraction=0.25, by="random", seed=0)
    workflow = Workflow(cat_names=IDS, label=("rating", 4.0), label_name="liked").fit(train)
    for name, rows in (("train", train), ("valid", valid)):
        to_parquet_dataset(workflow.transform(rows), root / name, **workflow.column_kinds(), row_group_size=1000,
                           progress=False)
    return root, workflow.categorify.cardinalities


def _setup(root, cards, l2=0.0):
    keras.utils.set_random_seed(0)
    train = ParquetLoader(root / "train", 256, ["liked"], cat_names=IDS, seed=1)
    valid = ParquetLoader(root / "valid", 1000, ["liked"], cat_names=IDS, shuffle=False)
    model = EmbeddingMLP(cards, dims=32, hidden=[64], l2=l2)
    model.compile(optimizer=sok.optimizers.Adam(0.03))
    return model, train, valid


def test_patience_stops_an_overfitting_run_and_restores_its_best_weights(ratings):
    model, train, valid = _setup(*ratings)
    h = fit(model, train, epochs=40, eval_loader=valid, eval_interval=len(train), patience=3,
            restore_best_weights=True, progress=False, verbose=0)
    best = int(np.argmax(h.eval_auc))
    assert h.stopped_early and h.restored_best and len(h.eval_auc) < 40
    assert h.best_step == h.eval_step[best] and h.best_value == h.eval_auc[best]
    assert h.eval_step[-1] == h.best_step + 3 * len(train)  # exactly `patience` evaluations after the best
    assert h.eval_auc[-1] < h.best_value - 1e-3  # the run had got worse ...
    assert evaluate(model, valid)["auc"] == pytest.approx(h.best_value, abs=1e-7)  # ... and is given back


def test_without_restore_the_model_is_the_last_one_and_monitor_loss_keeps_the_lowest(ratings):
    model, train, valid = _setup(*ratings)
    h = fit(model, train, epochs=40, eval_loader=valid, eval_interval=len(train), patience=2, monitor="loss",
            progress=False, verbose=0)
    assert h.stopped_early and not h.restored_best
    assert h.best_value == min(h.eval_loss) and h.best_step == h.eval_step[int(np.argmin(h.eval_loss))]
    assert evaluate(model, valid)["loss"] == pytest.approx(h.eval_loss[-1], rel=1e-6)


def test_min_delta_counts_small_gains_as_no_improvement(ratings):
    model, train, valid = _setup(*ratings)
    h = fit(model, train, epochs=6, eval_loader=valid, eval_interval=len(train), patience=1, min_delta=1.0,
            progress=False, verbose=0)  # no AUC can gain 1.0: stop at the second evaluation
    assert h.stopped_early and h.eval_step == [len(train), 2 * len(train)] and h.best_step == len(train)


def test_best_weights_live_in_the_snapshot_directory_and_survive_a_resume(ratings, tmp_path):
    model, train, valid = _setup(*ratings)
    h = fit(model, train, epochs=3, eval_loader=valid, eval_interval=len(train), snapshot_dir=tmp_path,
            snapshot_interval=len(train), restore_best_weights=True, progress=False, verbose=0)
    assert (tmp_path / "best" / "manifest.json").is_file()
    again, train2, valid2 = _setup(*ratings)
    h2 = fit(again, train2, epochs=3, eval_loader=valid2, eval_interval=len(train), snapshot_dir=tmp_path,
             restore_best_weights=True, progress=False, verbose=0)  # nothing left to train: resumed at the end
    assert h2.resumed_from == h.eval_step[-1] and (h2.best_step, h2.best_value) == (h.best_step, h.best_value)


def test_model_losses_are_added_to_the_training_loss(ratings):
    root, cards = ratings
    seen = {}
    for l2 in (0.0, 1.0):
        model, train, _ = _setup(root, cards, l2=l2)
        h = fit(model, train, max_steps=4, log_interval=4, progress=False, verbose=0)
        seen[l2] = h.loss[0]
        assert bool(model.losses) == (l2 > 0)
    assert seen[1.0] > seen[0.0] + 1e-3  # the penalty on the looked-up vectors is part of what is minimised


@pytest.mark.parametrize("kwargs, message", [
    ({"patience": 2}, r"patience=2 needs evaluations"),
    ({"patience": 0, "eval_interval": 1}, r"patience"),
    ({"monitor": "accuracy", "eval_interval": 1}, r"monitor='accuracy' is invalid"),
    ({"min_delta": -0.1, "eval_interval": 1}, r"min_delta=-0.1"),
    ({"min_delta": float("inf"), "eval_interval": 1}, r"min_delta=inf, expected a finite number"),
])
def test_bad_early_stopping_options_are_refused_before_training(ratings, kwargs, message):
    model, train, valid = _setup(*ratings)
    with pytest.raises(ValueError, match=message):
        fit(model, train, eval_loader=valid, progress=False, verbose=0, **kwargs)
    assert not model.optimizer.built  # nothing trained


def test_an_undefined_validation_auc_is_reported_and_never_picks_the_best_step(ratings):
    """A validation set of one class has no AUC: evaluate says so, and fit refuses to stop early or
    roll back on it (NaN compares as no change, so a NaN 'best' would be kept forever)."""
    model, train, valid = _setup(*ratings)
    features, labels = next(iter(valid))
    one_class = [(features, tf.ones_like(labels))]
    with pytest.warns(RuntimeWarning, match=r"AUC is undefined \(NaN\): the 1000 evaluation labels hold 1000 "
                                            r"positives and 0 negatives"):
        assert np.isnan(evaluate(model, one_class)["auc"])
    for kwargs in ({"patience": 2}, {"restore_best_weights": True}):
        with pytest.warns(RuntimeWarning), pytest.raises(ValueError, match=r"validation auc at step 3 is undefined "
                                                                            r".* all of one class.*monitor='loss'"):
            fit(model, train, max_steps=6, eval_loader=one_class, eval_interval=3, progress=False, verbose=0,
                **kwargs)
    with pytest.warns(RuntimeWarning):  # the loss is defined: early stopping on it works
        h = fit(model, train, max_steps=6, eval_loader=one_class, eval_interval=3, patience=2, monitor="loss",
                progress=False, verbose=0)
    assert h.best_value == min(h.eval_loss) and all(np.isnan(h.eval_auc))


def test_restore_best_weights_needs_an_eval_loader(ratings):
    model, train, _ = _setup(*ratings)
    with pytest.raises(ValueError, match="restore_best_weights=True needs an eval_loader"):
        fit(model, train, restore_best_weights=True, progress=False, verbose=0)


def test_roc_auc_is_the_share_of_correctly_ordered_pairs_with_ties_half():
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.3
    scores = np.round(rng.normal(labels * 0.7, 1.0), 1)  # rounded: many ties
    pairs = [(1.0 if p > n else 0.5 if p == n else 0.0)
             for p, n in itertools.product(scores[labels], scores[~labels])]
    assert roc_auc(labels, scores) == pytest.approx(np.mean(pairs), abs=1e-12)
    probabilities = 1 / (1 + np.exp(-scores))
    acc = AucAccumulator()
    acc.update(probabilities, labels)
    assert acc.auc() == pytest.approx(roc_auc(labels, scores), abs=1e-4)
    assert np.isnan(roc_auc(np.zeros(5), np.arange(5)))
    with pytest.raises(ValueError, match="labels has 3 values but scores has 2"):
        roc_auc(np.zeros(3), np.zeros(2))


def test_keras_early_stopping_restores_a_model_with_sparse_tables_in_model_fit(ratings):
    """The notebooks that train with ``model.fit`` use Keras' own callback: our tables and sparse
    optimizer must survive its get_weights / set_weights round trip."""
    model, train, valid = _setup(*ratings)
    model.compile(optimizer=model.optimizer, loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.AUC(from_logits=True, name="auc")])
    stop = keras.callbacks.EarlyStopping(monitor="val_auc", mode="max", patience=2, restore_best_weights=True)
    h = model.fit(train, validation_data=valid, epochs=30, callbacks=[stop], verbose=0)
    aucs = h.history["val_auc"]
    assert stop.stopped_epoch > 0 and len(aucs) < 30 and max(aucs) > aucs[-1]
    restored = model.evaluate(valid, verbose=0, return_dict=True)["auc"]
    assert restored == pytest.approx(max(aucs), abs=1e-6)
