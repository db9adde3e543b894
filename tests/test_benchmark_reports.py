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


def test_eviction_report_sets_a_bound_beside_its_table_and_never_as_a_goal():
    results = {"roomy": _case(100.0), "lru_full": _case(78.0), "lru_full_free_choice": _case(88.0)}
    rows, notes = _eviction.report(results, {}, {"timed_steps": 36})
    bound = next(r for r in rows if r["table"] == "lru_full_free_choice")
    assert bound["bound_of"] == "lru_full" and bound["vs_roomy_amortized"] == 0.88 and "goal" not in bound
    assert notes["bounds"] == {"lru_full_free_choice": {"vs_roomy_amortized": 0.88, "goal_of_its_table": 0.85,
                                                        "its_table_vs_roomy_amortized": 0.78}}
    assert not any("free_choice" in name for name in notes["goals"])


def test_free_choice_places_a_new_key_in_its_buckets_first_empty_row_else_where_its_bits_say():
    import numpy as np
    import tensorflow as tf

    from sok_tutorial.embedding.buckets import BucketedIndex

    index = BucketedIndex(capacity=64, width=8, policy="lru")
    index.create(lambda name, shape, dtype, value: tf.Variable(tf.cast(tf.broadcast_to(value, shape), dtype)))
    _eviction.free_choice(index)
    candidates = np.arange(1, 4000, 129, dtype=np.int64)  # (keys in four different buckets: none is lost)
    keys = candidates[np.unique(index.bucket_np(candidates), return_index=True)[1][:4]]
    placed = index.place(tf.constant(keys), None, tf.constant(1, tf.int64))
    assert placed.rows.numpy().tolist() == (index.bucket_np(keys) * 8).tolist()  # (empty buckets: their first row)
    assert placed.new_keys.numpy().tolist() == keys.tolist() and placed.evicted.numpy().size == 0
    again = index.place(tf.constant(keys[:1]), None, tf.constant(2, tf.int64))  # a hit: no new key, the same row
    assert again.new_keys.numpy().size == 0 and again.rows.numpy()[0] == placed.rows.numpy()[0]
    bucket = index.bucket_np(keys[:1])[0]  # fill its bucket, then one more key of it goes where its bits say
    others = np.arange(5000, 400000, 131, dtype=np.int64)
    others = others[index.bucket_np(others) == bucket][:8]
    for i in range(7):
        assert int(index.place(tf.constant(others[i:i + 1]), None, tf.constant(3 + i, tf.int64)).rows[0]) == \
            bucket * 8 + 1 + i
    last = index.place(tf.constant(others[7:]), None, tf.constant(20, tf.int64))
    slot = (int(others[7]) >> 7) & 7
    assert int(last.rows[0]) == bucket * 8 + slot
    assert last.evicted.numpy().tolist() == [keys[0] if slot == 0 else others[slot - 1]]  # (the row's key before)


def _tables_results(paired: dict[str, list[tuple[float, float]]]) -> dict[str, list[dict]]:
    """torchrec_shape results: every table kind at 100 samples/s (static 200), and for the optimizers
    in `paired` one paired run per (cold, warm) ratio given."""
    from benchmarks import _tables, embedding

    results = {f"torchrec_shape:{kind}:{o}": [{"samples_per_s": 200.0 if kind == "static" else 100.0,
                                                "cpu_busy": 1.5}]
               for o in _tables.OPTIMIZERS for kind in embedding.TABLE_KINDS}
    for optimizer, ratios in paired.items():
        results[f"torchrec_shape:paired:{optimizer}"] = [
            {phase: {"static_samples_per_s": 100.0, "dynamic_samples_per_s": 100.0 * ratio,
                     "dynamic_vs_static": ratio, "ratio_q1": ratio - 0.02, "ratio_q3": ratio + 0.03}
             for phase, ratio in zip(("cold", "warm"), pair)} for pair in ratios]
    return results


def test_tables_report_gives_the_paired_ratios_as_the_median_over_rounds_beside_the_separate_ones():
    from benchmarks import embedding

    results = _tables_results({"sgd": [(0.70, 0.95), (0.80, 0.85), (0.75, 0.91)]})
    rows, notes = embedding.tables_report(results, {}, {})
    paired = {r["table"]: r for r in rows if r["optimizer"] == "sgd" and r["table"].startswith("paired")}
    assert paired["paired_cold"]["dynamic_vs_static"] == 0.75 and paired["paired_warm"]["dynamic_vs_static"] == 0.91
    assert paired["paired_warm"]["ratio_quartiles"] == [0.89, 0.94]  # (the medians of each round's quartiles)
    goals = notes["goals"]
    assert goals["dynamic_cold_vs_static_paired_sgd"]["measured"] == 0.75
    assert goals["dynamic_warm_vs_static_paired_sgd"]["measured"] == 0.91
    assert goals["dynamic_vs_static_sgd"]["measured"] == goals["dynamic_warm_vs_static_sgd"]["measured"] == 0.5
    assert "dynamic_cold_vs_static_paired_adam" not in goals  # (no paired run of Adam: no paired goal)
    assert not [r for r in rows if r["optimizer"] == "adam" and r["table"].startswith("paired")]
