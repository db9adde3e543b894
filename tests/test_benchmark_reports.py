"""The benchmark reports' own checks, on made-up results (no benchmark runs here)."""
from __future__ import annotations

import pytest

from benchmarks import _eviction


def _case(amortized: float) -> list[dict]:
    return [{"capacity": 10, "samples_per_s": amortized, "samples_per_s_amortized": amortized,
             "evicted_per_step": 0, "evicting_steps": 0, "new_rows_per_step": 1, "ms_evicting_step": None,
             "ms_other_step": 1.0, "unplaced_per_step": 0, "index_bytes_per_row": 12,
             "cores_busy": 1.5}]


@pytest.mark.parametrize(("tracked", "flagged"), [(100.0, False), (103.0, False), (120.0, True)])
def test_eviction_report_flags_a_roomy_table_slower_than_its_tracked_twin(tracked, flagged):
    results = {"roomy": _case(100.0), "roomy_tracked": _case(tracked), "lru_full": _case(85.0)}
    rows, notes = _eviction.report(results, {}, {"timed_steps": 36})
    assert notes["roomy_check"] == {"tracked_vs_roomy_amortized": round(tracked / 100.0, 2), "roomy_ran_slow": flagged}
    assert [r["vs_roomy_amortized"] for r in rows if r["table"] == "lru_full"] == [0.85]  # the ratios stay as measured


def test_eviction_report_sets_lfu_and_wider_buckets_against_lru_at_capacity_within_the_run():
    results = {"roomy": _case(100.0), "lru_full": _case(80.0), "lfu_full": _case(60.0), "lru_full_w16": _case(88.0)}
    _, notes = _eviction.report(results, {}, {"timed_steps": 36})
    assert notes["within_run"] == {"lfu_full_vs_lru_full_amortized": 0.75, "lru_full_w16_vs_lru_full_amortized": 1.1}
    _, notes = _eviction.report({"roomy": _case(100.0), "lfu_full": _case(60.0)}, {}, {"timed_steps": 36})
    assert notes["within_run"] == {}  # (no LRU table at capacity in the run: nothing to set them against)
