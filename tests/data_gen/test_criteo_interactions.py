"""`CriteoLike(interactions=...)`: pairs of small fields whose clicks depend on the product of
their ids' latent vectors, which a model of one weight per id cannot fit."""
from __future__ import annotations

import numpy as np
import pytest

from data_gen.criteo import CAT_NAMES, LEARNABLE_PAIRS, CriteoLike, scaled_cardinalities
from sok_tutorial.training.metrics import roc_auc

CARDS = scaled_cardinalities(0.001)


def test_without_interactions_the_data_is_unchanged_and_with_them_only_the_labels_move():
    plain, default = CriteoLike(CARDS, seed=4).sample(5000), CriteoLike(CARDS, seed=4, interactions=0.0).sample(5000)
    assert all(np.array_equal(plain[k], default[k], equal_nan=True) for k in plain)
    mixed = CriteoLike(CARDS, seed=4, interactions=0.5).sample(5000)
    assert all(np.array_equal(plain[k], mixed[k], equal_nan=True) for k in plain if k not in ("label", "probability"))
    assert not np.allclose(plain["probability"], mixed["probability"])


def additive_auc(train: dict[str, np.ndarray], valid: dict[str, np.ndarray], fields: list[int]) -> float:
    """AUC of the best a weight per id can do field by field: the sum of each id's smoothed
    log-odds of a click in `train`, scored on `valid`."""
    score = np.zeros(len(valid["label"]))
    prior = train["label"].mean()
    for f in fields:
        name = CAT_NAMES[f]
        size = int(max(train[name].max(), valid[name].max())) + 1
        clicks = np.bincount(train[name], weights=train["label"], minlength=size)
        seen = np.bincount(train[name], minlength=size)
        rate = (clicks + 20 * prior) / (seen + 20)
        score += np.log(rate / (1 - rate))[valid[name]]
    return roc_auc(valid["label"], score)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_planted_pairs_carry_signal_that_weights_per_id_cannot_fit(seed):
    """With every other weight at 0 (signal=0), the clicks come from the pairs alone: the oracle
    sees them, while the additive model of the pairs' fields stays near chance."""
    model = CriteoLike(CARDS, seed=seed, signal=0.0, interactions=0.6)
    train, valid = model.sample(200_000, block=0), model.sample(50_000, block=1)
    fields = sorted({f for pair in LEARNABLE_PAIRS for f in pair})
    oracle = roc_auc(valid["label"], valid["probability"])
    assert oracle > 0.7
    assert additive_auc(train, valid, fields) < 0.56


def test_interactions_are_checked():
    with pytest.raises(ValueError, match="interactions"):
        CriteoLike(CARDS, interactions=-0.1)


@pytest.mark.parametrize("f", [5, 8, 15, 25])
def test_rank_probabilities_are_the_frequencies_the_sampler_draws(f):
    model = CriteoLike(CARDS, seed=2)
    p = model.rank_probabilities(f)
    ranks = np.argsort(model._perm[f])[model.sample(100_000)[CAT_NAMES[f]]]  # id -> its frequency rank
    seen = np.bincount(ranks, minlength=len(p)) / 100_000
    assert abs(p.sum() - 1) < 1e-9 and np.all(np.diff(p) <= 1e-12)  # a distribution, decreasing along the ranks
    np.testing.assert_allclose(seen, p, atol=0.006)
