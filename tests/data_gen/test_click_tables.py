"""`data_gen.click_tables.ClickSamples`: notebook 06's seeded clicks over three inputs."""
from __future__ import annotations

import numpy as np
import pytest

from data_gen.click_tables import ClickSamples

FIELDS = [300, 40, 7]


def test_same_seed_same_batches_in_the_same_order():
    a, b = ClickSamples(500, FIELDS, seed=3), ClickSamples(500, FIELDS, seed=3)
    for _ in range(3):
        (fa, ya), (fb, yb) = a.batch(64), b.batch(64)
        assert all(np.array_equal(fa[k], fb[k]) for k in fa) and np.array_equal(ya, yb)
    assert not np.array_equal(ClickSamples(500, FIELDS, seed=4).batch(64)[0]["items"], a.batch(64)[0]["items"])


def test_each_input_stays_in_its_key_range():
    features, labels = ClickSamples(500, FIELDS, seed=0, items_per_sample=4).batch(2000)
    assert features["items"].shape == (2000, 1, 4) and features["fields"].shape == (2000, 3, 1)
    assert features["weekday"].shape == (2000, 1) and labels.shape == (2000, 1) and labels.dtype == np.float32
    assert all(v.dtype == np.int64 for v in features.values())
    assert 0 <= features["items"].min() and features["items"].max() < 500
    starts = np.cumsum([0, *FIELDS])
    for f in range(3):  # field f's keys in [start_f, start_f + size_f): the fields can share a table
        keys = features["fields"][:, f, 0]
        assert starts[f] <= keys.min() and keys.max() < starts[f + 1]
    assert set(np.unique(features["weekday"])) == set(range(7))


def test_keys_are_skewed_and_labels_follow_the_planted_model():
    samples = ClickSamples(500, FIELDS, seed=0)
    features, labels = samples.batch(5000)
    counts = np.bincount(features["items"].ravel(), minlength=500)
    assert counts[0] > 10 * counts[10] > 0  # Zipf-skewed: small keys are the frequent ones
    truth = samples.truth
    logit = (truth["items"][features["items"]].sum((1, 2)) + truth["fields"][features["fields"]].sum((1, 2))
             + truth["weekday"][features["weekday"][:, 0]])
    high, low = labels[logit > np.median(logit)].mean(), labels[logit <= np.median(logit)].mean()
    assert 0 < labels.mean() < 1 and high > low + 0.1


@pytest.mark.parametrize("kwargs,message", [({"item_vocabulary": 0}, "item_vocabulary=0"),
                                            ({"field_sizes": []}, r"field_sizes=\[\]"),
                                            ({"field_sizes": [5, -1]}, r"field_sizes\[1\]=-1"),
                                            ({"items_per_sample": 0}, "items_per_sample=0")])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClickSamples(**{"item_vocabulary": 10, "field_sizes": [5], **kwargs})
