from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sok_tutorial.data.categorify import OOV, Categorify, get_embedding_sizes


@given(st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=1, max_size=200),
       st.integers(0, 3))
def test_ids_match_a_frequency_ordered_dict(values, threshold):
    counts: dict[int, int] = {}
    for v in values:
        if v is not None:
            counts[v] = counts.get(v, 0) + 1
    kept = sorted((v for v, c in counts.items() if c >= threshold), key=lambda v: (-counts[v], v))
    if not kept:
        return
    expected = {v: i + 1 for i, v in enumerate(kept)}
    arr = pa.array(values, type=pa.int64())
    cat = Categorify(["k"], freq_threshold=threshold).fit(pa.table({"k": arr}))
    ids = cat.transform(pa.table({"k": arr}))["k"].to_pylist()
    assert ids == [expected.get(v, OOV) if v is not None else OOV for v in values]
    assert cat.cardinalities == {"k": len(kept) + 1}


def test_chunked_fit_equals_one_shot_and_merge_of_workers():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"s": rng.choice(list("abcdefgh"), 1000), "n": rng.zipf(1.5, 1000)})
    whole = Categorify(["s", "n"]).fit(df)
    chunked = Categorify(["s", "n"])
    for i in range(0, 1000, 97):
        chunked.partial_fit(df.iloc[i:i + 97])
    chunked.finish_fit()
    a, b = Categorify(["s", "n"]).partial_fit(df.iloc[:500]), Categorify(["s", "n"]).partial_fit(df.iloc[500:])
    merged = a.merge(b).finish_fit()
    for other in (chunked, merged):
        for col in ("s", "n"):
            assert whole.vocabularies[col].equals(other.vocabularies[col])


def test_list_columns_keep_lengths_and_strings_work():
    table = pa.table({"genres": pa.array([["Drama", "Comedy"], [], ["Drama"], None, ["Horror"]])})
    cat = Categorify(["genres"]).fit(table)
    out = cat.transform(pa.table({"genres": pa.array([["Comedy", "Drama", "Western"], []])}))
    assert out["genres"].to_pylist() == [[2, 1, 0], []]  # Drama most frequent -> 1, unseen -> 0


def test_save_load_round_trip_maps_new_data_identically(tmp_path):
    df = pd.DataFrame({"user": ["u3", "u1", "u3", "u2", "u1", "u3"], "item": [5, 6, 5, 7, 8, 5]})
    cat = Categorify(["user", "item"], freq_threshold=2).fit(df)
    cat.save(tmp_path / "cat")
    loaded = Categorify.load(tmp_path / "cat")
    new = pd.DataFrame({"user": ["u1", "u2", "zz", None], "item": [5, 8, 9, 6]})
    assert loaded.transform(new).equals(cat.transform(new))
    assert loaded.transform(new)["user"].to_pylist() == [2, 0, 0, 0]  # u2 seen once < threshold
    with pytest.raises(FileExistsError):
        cat.save(tmp_path / "cat")


def test_max_size_keeps_most_frequent():
    cat = Categorify(["k"], max_size=2).fit({"k": [1, 1, 1, 2, 2, 3]})
    assert cat.transform({"k": [1, 2, 3]})["k"].to_pylist() == [1, 2, 0]


def test_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="columns="):
        Categorify([])
    with pytest.raises(ValueError, match="freq_threshold=-1"):
        Categorify(["a"], freq_threshold=-1)
    with pytest.raises(RuntimeError, match="not fitted"):
        Categorify(["a"]).transform({"a": [1]})
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['b'\]"):
        Categorify(["b"]).fit({"a": [1]})
    with pytest.raises(ValueError, match="no non-null values"):
        Categorify(["a"]).fit({"a": pa.array([None, None], type=pa.int64())})
    with pytest.raises(FileNotFoundError, match="no saved Categorify"):
        Categorify.load(tmp_path)


def test_embedding_sizes_rule():
    sizes = get_embedding_sizes({"small": 3, "mid": 5000, "huge": 10**7})
    assert sizes["small"] == (3, 16)
    assert sizes["mid"] == (5000, round(1.6 * 5000 ** 0.56))
    assert sizes["huge"] == (10**7, 512)
    with pytest.raises(ValueError, match="cardinality of 'x'"):
        get_embedding_sizes({"x": 0})
