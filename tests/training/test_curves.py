"""`StepLosses` and `ValidationAUC`: a loss curve and a validation-AUC curve from ``model.fit``."""
from __future__ import annotations

import keras
import numpy as np
import pytest

from sok_tutorial.training import evaluate
from sok_tutorial.training.callbacks import StepLosses, ValidationAUC


def model_and_data(seed: int = 0) -> tuple[keras.Model, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(768, 3)).astype("float32")
    y = (x[:, :1] + 0.5 * x[:, 1:2] > 0).astype("float32")
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.2), keras.losses.BinaryCrossentropy(from_logits=True))
    return model, x, y


def test_step_losses_are_each_batch_s_own_loss_over_epochs():
    """Each recorded loss equals the loss of that batch at the weights it was computed with."""
    model, x, y = model_and_data()
    model.compile(keras.optimizers.SGD(0.0), keras.losses.BinaryCrossentropy(from_logits=True))  # weights fixed
    losses = StepLosses()
    model.fit(x, y, batch_size=128, epochs=2, shuffle=False, callbacks=[losses], verbose=0)
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    per_batch = [float(bce(y[i:i + 128], model(x[i:i + 128]))) for i in range(0, 768, 128)]
    np.testing.assert_allclose(losses.losses, per_batch * 2, rtol=1e-5)


def test_validation_auc_every_n_steps_and_at_the_end(tmp_path):
    model, x, y = model_and_data()
    valid = [(x[600:], y[600:])]
    curve = ValidationAUC(valid, every=5, log_dir=tmp_path / "tb")
    model.fit(x[:600], y[:600], batch_size=50, epochs=1, callbacks=[curve], verbose=0)  # 12 steps
    assert [s for s, _ in curve.history] == [5, 10, 12]
    assert curve.history[-1][1] == pytest.approx(evaluate(model, valid)["auc"])
    assert curve.history[-1][1] > curve.history[0][1] - 0.05 and curve.history[-1][1] > 0.8
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(curve.seconds) == 3 and all(s > 0 for s in curve.seconds)
    assert curve.seconds_between(5, 12) == pytest.approx(sum(curve.seconds[:2]))  # not the one after the last step


def test_a_throughput_can_leave_out_the_evaluations():
    from sok_tutorial.training.callbacks import ThroughputLogger

    model, x, y = model_and_data()
    throughput, curve = ThroughputLogger(50, every=4, warmup=2), ValidationAUC([(x, y)] * 20, every=3)
    model.fit(x[:600], y[:600], batch_size=50, epochs=1, callbacks=[throughput, curve], verbose=0)
    spent = curve.seconds_between(2, 12)
    assert spent > 0 and throughput.rate(excluding=spent) > throughput.rate()


def test_every_must_be_positive():
    with pytest.raises(ValueError, match="every=0"):
        ValidationAUC([], every=0)
