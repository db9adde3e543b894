"""ROC AUC in NumPy: `roc_auc` (exact, ties counted half) and `AucAccumulator` (streaming, exact to
about 1e-5), so that a model, its baselines and the data's oracle are scored by one definition.

Keras' ``keras.metrics.AUC`` interpolates over a fixed grid of thresholds (200 by default), which
moves its figure by up to a few thousandths: enough to reorder a model and a baseline that are
close. Both functions here count, over every pair of a positive and a negative example, how often
the positive scores higher (a tie counts one half), which is what scikit-learn's
``roc_auc_score`` computes.
"""
from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counted half.

    Args:
        labels: 0/1 (or bool) per example, any shape (flattened).
        scores: one score per example, any monotone scale (logits or probabilities).

    Returns:
        The AUC, or NaN when the labels are all of one class.

    Example:
        >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
        0.75
        >>> roc_auc(np.array([0, 1, 0, 1]), np.array([0.5, 0.5, 0.2, 0.9]))  # a tie counts half
        0.875
    """
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, np.float64).reshape(-1)
    if labels.shape != scores.shape:
        raise ValueError(f"roc_auc: labels has {labels.size} values but scores has {scores.size}")
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # 1-based ranks, ties at their mean
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


class AucAccumulator:
    """Exact-to-1e-5 streaming ROC AUC from a histogram of scores in [0, 1] per label.

    Example:
        >>> acc = AucAccumulator()
        >>> acc.update(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
        >>> round(acc.auc(), 3)
        0.75
    """

    def __init__(self, bins: int = 1 << 16):
        self.bins = bins
        self.pos = np.zeros(bins, np.int64)
        self.neg = np.zeros(bins, np.int64)

    def update(self, scores: np.ndarray, labels: np.ndarray) -> None:
        idx = np.minimum((np.asarray(scores, np.float64).reshape(-1) * self.bins).astype(np.int64), self.bins - 1)
        labels = np.asarray(labels).reshape(-1).astype(bool)
        self.pos += np.bincount(idx[labels], minlength=self.bins)
        self.neg += np.bincount(idx[~labels], minlength=self.bins)

    def auc(self) -> float:
        """P(score of a random positive > score of a random negative), ties counted half."""
        n_pos, n_neg = self.pos.sum(), self.neg.sum()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        neg_below = np.cumsum(self.neg) - self.neg
        wins = (self.pos * neg_below).sum() + 0.5 * (self.pos * self.neg).sum()
        return float(wins / (n_pos * n_neg))
