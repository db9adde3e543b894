"""The training cache's reports: pass records in TensorBoard, throughput over whole passes, and
the share of their time that pulls and write-backs take."""
from __future__ import annotations

import pytest

from sok_tutorial.cache.reports import cache_share, log_passes, pass_throughput

RECORDS = [{"samples": 1000, "pull_s": 0.5, "train_s": 3.0, "write_back_s": 0.5, "loss": 0.6, "eval_auc": 0.7},
           {"samples": 1000, "pull_s": 0.2, "train_s": 1.6, "write_back_s": 0.2, "loss": 0.5}]


def test_throughput_counts_every_second_of_a_pass_after_the_first():
    assert pass_throughput(RECORDS) == pytest.approx(1000 / 2.0)
    assert pass_throughput(RECORDS, skip=0) == pytest.approx(2000 / 6.0)
    assert cache_share(RECORDS) == pytest.approx(1.4 / 6.0)
    with pytest.raises(ValueError, match="skip=2"):
        pass_throughput(RECORDS, skip=2)
    with pytest.raises(ValueError, match="records is empty"):
        cache_share([])


def test_log_passes_writes_each_key_a_record_has(tmp_path):
    tf = pytest.importorskip("tensorflow")
    log_passes(tmp_path / "run", RECORDS, first_step=3)
    logged = {}
    for path in (tmp_path / "run").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                logged.setdefault(value.tag, []).append(event.step)
    assert logged == {"pass/loss": [3, 4], "pass/eval_auc": [3], "pass/pull_s": [3, 4], "pass/train_s": [3, 4],
                      "pass/write_back_s": [3, 4]}
