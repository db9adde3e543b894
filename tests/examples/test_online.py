"""Notebook 08's helpers: `train_day` is the library's step (one device: ``model.fit``; N replicas
with a row-sharded table: one device), `train_days` scores each next day before training on it,
and what a `Publisher` publishes serves the trainer's predictions."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from data_gen.drifting import drifting_day
from sok_tutorial.examples.online import Publisher, load_server, online_model, score, train_day, train_days

CAPACITY, DIM, LR, BATCH = 256, 4, 0.02, 64


def day(d: int, rows: int = 500) -> tuple[np.ndarray, np.ndarray]:  # 7 batches of 64 and one of 52
    return drifting_day(d, rows=rows, population=150, item_drift=40, user_drift=15)


def lru(capacity: int = CAPACITY, **options):
    return online_model(capacity, DIM, LR, eviction_policy="lru", **options)


def test_on_one_device_a_day_is_model_fit():
    keys, labels = day(0)
    fitted, stepped = lru(), lru()
    fitted.fit(keys, labels, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    train_day(stepped, tf.distribute.get_strategy(), keys, labels, BATCH)
    np.testing.assert_allclose(score(stepped, keys), score(fitted, keys), rtol=1e-5, atol=1e-5)


def test_a_row_sharded_table_on_two_replicas_trains_as_one_device(strategy_of):
    strategy = strategy_of(2)
    one = lru()
    with strategy.scope():
        two = lru(CAPACITY // 2, sharding="row")
    for d in range(2):
        keys, labels = day(d, rows=512)
        train_day(one, tf.distribute.get_strategy(), keys, labels, BATCH)
        train_day(two, strategy, keys, labels, BATCH)
    probe = day(2)[0]
    np.testing.assert_allclose(score(two, probe), score(one, probe), rtol=1e-4, atol=1e-4)


def test_a_last_batch_that_does_not_split_over_the_replicas_is_refused(strategy_of):
    strategy = strategy_of(2)
    with strategy.scope():
        model = lru(CAPACITY // 2, sharding="row")
    keys, labels = day(0, rows=501)
    with pytest.raises(ValueError, match=r"ends in a batch of 53, which does not split over 2 replicas"):
        train_day(model, strategy, keys, labels, BATCH)


def test_train_days_scores_each_next_day_before_training_on_it():
    days = [day(d) for d in range(3)]
    seen = []
    run = train_days(lru(), days, BATCH, after_day=lambda d, model: seen.append(d))
    assert seen == [0, 1, 2] and len(run["auc"]) == 2 and len(run["rows"]) == len(run["train_s"]) == 3
    assert all(0 < a < 1 for a in run["auc"]) and run["rows"][-1] <= CAPACITY
    assert run["evicted"] == sorted(run["evicted"])  # evictions so far, day by day


def test_the_served_copy_predicts_as_the_trainer(tmp_path):
    model = lru(128, eviction_log=4096)  # small: it evicts, and the deltas carry the evictions
    publisher = Publisher(tmp_path, full_exports=True)
    run = train_days(model, [day(d) for d in range(3)], BATCH, after_day=lambda d, m: publisher.publish(m))
    assert run["evicted"][-1] > 0
    assert [p.name for p in sorted(tmp_path.glob("delta-*"))] == ["delta-01", "delta-02"]
    assert len(publisher.delta_bytes) == len(publisher.full_bytes) == 2
    assert all(0 < d < f for d, f in zip(publisher.delta_bytes, publisher.full_bytes))
    probe = day(3)[0]
    server = load_server(publisher.serving, lambda: lru(128, eviction_log=4096))
    np.testing.assert_allclose(score(server, probe), score(model, probe), atol=1e-6)
