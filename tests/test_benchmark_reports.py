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
