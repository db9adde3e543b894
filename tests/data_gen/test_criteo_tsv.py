from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_gen.criteo import CAT_NAMES, CONT_NAMES, scaled_cardinalities, write_criteo_tsv
from data_gen.criteo_tsv import MalformedLineError, iter_criteo_tsv, preprocess_criteo
from sok_tutorial.data.categorify import Categorify
from sok_tutorial.data.keyset import keyset_path, read_keyset
from sok_tutorial.data.schema import resolve_files


def _line(label="1", ints=None, cats=None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *cats]) + "\n"


def _rows(path, **kw):
    return pa.concat_tables(list(iter_criteo_tsv(path, **kw)))


def test_reads_types_and_missing_values(tmp_path):
    path = tmp_path / "day_0"
    path.write_text(_line() + _line("0", [""] * 13, [""] * 26) + "\n")
    table = _rows(path)
    assert table.num_rows == 2 and table.schema.field("I1").type == pa.float32()
    assert table["I13"].to_pylist() == [12.0, None] and table["C1"].to_pylist() == ["00000000", None]


def test_wrong_field_count_names_file_and_line(tmp_path):
    path = tmp_path / "day_0"
    path.write_text(_line() * 3 + "1\t2\t3\n" + _line() * 2)
    with pytest.raises(MalformedLineError, match=r"day_0:4: expected 40 tab-separated fields, found 3"):
        _rows(path)
    counter = {}
    assert _rows(path, on_bad_lines="skip", counter=counter).num_rows == 5
    assert counter == {"rows": 5, "bad_lines": 1}


def test_bad_number_names_file_and_line(tmp_path):
    path = tmp_path / "day_1"
    ints = [str(i) for i in range(13)]
    path.write_text(_line() + _line("1", ints[:4] + ["abc"] + ints[5:]) + _line("7"))
    with pytest.raises(MalformedLineError, match=r"day_1:2: invalid value\(s\) \{'I5': 'abc'\}"):
        _rows(path)
    counter = {}
    assert _rows(path, on_bad_lines="skip", counter=counter)["label"].to_pylist() == [1]
    assert counter["bad_lines"] == 2  # 'abc' and the label 7


def test_a_token_that_is_not_utf8_names_file_and_line_and_can_be_skipped(tmp_path):
    path = tmp_path / "day_3"
    cats = [f"{i:08x}" for i in range(26)]
    bad = _line("0", cats=["abXX"] + cats[1:]).encode().replace(b"abXX", b"ab\xff")
    path.write_bytes(_line().encode() * 2 + bad + _line("0").encode())
    with pytest.raises(MalformedLineError, match=r"day_3:3: not valid UTF-8"):
        _rows(path)
    counter = {}
    table = _rows(path, on_bad_lines="skip", counter=counter)
    assert table["label"].to_pylist() == [1, 1, 0] and counter == {"rows": 3, "bad_lines": 1}


def test_a_last_line_without_newline_is_judged_on_its_own_bytes(tmp_path):
    path = tmp_path / "day_5"
    cats = [f"{i:08x}" for i in range(26)]
    path.write_bytes(_line().encode() + _line("2", cats=cats[:-1] + ["café"]).encode().rstrip(b"\n"))
    with pytest.raises(MalformedLineError, match=r"day_5:2: invalid value\(s\) \{'label': '2'\}"):
        _rows(path)


def test_a_line_longer_than_pyarrows_block_is_read(tmp_path):
    path = tmp_path / "day_4"
    cats = [f"{i:08x}" for i in range(26)]
    path.write_text(_line() + _line("0", cats=["x" * (3 << 20)] + cats[1:]) + _line())
    table = _rows(path, block_bytes=1 << 20)
    assert table.num_rows == 3 and len(table["C1"][1].as_py()) == 3 << 20


def test_line_numbers_survive_block_boundaries(tmp_path):
    path = tmp_path / "day_2"
    lines = [_line()] * 500
    lines[377] = "broken line\n"
    path.write_text("".join(lines))
    with pytest.raises(MalformedLineError, match=r"day_2:378:"):
        _rows(path, block_bytes=1000)  # lines split across many small blocks
    whole = _rows(path, on_bad_lines="skip")
    small = _rows(path, on_bad_lines="skip", block_bytes=777)
    assert whole.equals(small) and whole.num_rows == 499


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("days")
    return write_criteo_tsv(root / "tsv", 9000, num_files=3, cardinalities=scaled_cardinalities(0.001),
                            seed=1, progress=False)


def test_preprocess_outputs_one_part_and_keyset_per_file(tmp_path, days):
    schema = preprocess_criteo(days, tmp_path / "pp", min_count=3, feature_crosses=[("C1", "C2")],
                               scheduler="synchronous", progress=False)
    assert [p["num_rows"] for p in schema.parts] == [3000, 3000, 3000]
    assert schema.names_of("categorical") == CAT_NAMES + ["C1_C2"]
    offsets = [schema[c].key_offset for c in schema.names_of("categorical")]
    cards = [schema[c].cardinality for c in schema.names_of("categorical")]
    assert offsets == list(np.concatenate([[0], np.cumsum(cards)[:-1]]))
    for part in resolve_files(tmp_path / "pp"):
        table = pq.read_table(part)
        keys = np.concatenate([table[c].to_numpy() + schema[c].key_offset for c in schema.names_of("categorical")])
        np.testing.assert_array_equal(read_keyset(keyset_path(part)), np.unique(keys))
    dense = np.concatenate([pq.read_table(p, columns=CONT_NAMES).to_pandas().to_numpy()
                            for p in resolve_files(tmp_path / "pp")])
    assert np.all(np.abs(dense.mean(axis=0)) < 1e-3) and np.all(np.abs(dense.std(axis=0) - 1) < 1e-2)


def test_rare_and_missing_tokens_share_bucket_zero(tmp_path):
    path = tmp_path / "day_0"
    cats = lambda tok: [tok] + [f"{i:08x}" for i in range(1, 26)]  # noqa: E731
    path.write_text(_line(cats=cats("aaaa")) * 5 + _line(cats=cats("rare")) + _line(cats=cats("")))
    schema = preprocess_criteo([path], tmp_path / "pp", min_count=2, scheduler="synchronous", progress=False)
    c1 = pq.read_table(tmp_path / "pp" / "part-00000.parquet")["C1"].to_pylist()
    assert c1 == [1] * 5 + [0, 0] and schema["C1"].cardinality == 2


def test_saved_categorify_maps_a_new_day_identically(tmp_path, days):
    preprocess_criteo(days[:2], tmp_path / "first", scheduler="synchronous", progress=False)
    cat = Categorify.load(tmp_path / "first" / "categorify")
    preprocess_criteo(days[2:], tmp_path / "again", categorify=cat, scheduler="synchronous", progress=False)
    preprocess_criteo(days, tmp_path / "all", scheduler="synchronous", progress=False)
    raw = pa.concat_tables(list(iter_criteo_tsv(days[2])))
    expected = cat.transform(raw.select(CAT_NAMES))["C3"].to_numpy()
    np.testing.assert_array_equal(pq.read_table(tmp_path / "again" / "part-00000.parquet")["C3"].to_numpy(), expected)


def test_a_vocabulary_fitted_on_the_training_day_sends_tokens_new_in_a_later_day_to_zero(tmp_path):
    """Notebook 05's split of a real download: validation rows are mapped through the training
    rows' vocabulary, so a token first seen in validation is out of vocabulary (id 0)."""
    cats = lambda tok: [tok] + [f"{i:08x}" for i in range(1, 26)]  # noqa: E731
    (tmp_path / "day_0").write_text(_line(cats=cats("aaaa")) * 2 + _line(cats=cats("bbbb")) * 2)
    (tmp_path / "day_1").write_text(_line(cats=cats("bbbb")) + _line(cats=cats("cccc")) + _line(cats=cats("aaaa")))
    train = preprocess_criteo([tmp_path / "day_0"], tmp_path / "train", min_count=1, scheduler="synchronous",
                              progress=False)
    vocabulary = Categorify.load(tmp_path / "train" / "categorify")
    valid = preprocess_criteo([tmp_path / "day_1"], tmp_path / "valid", min_count=1, categorify=vocabulary,
                              scheduler="synchronous", progress=False)
    trained = pq.read_table(tmp_path / "train" / "part-00000.parquet")["C1"].to_pylist()
    mapped = pq.read_table(tmp_path / "valid" / "part-00000.parquet")["C1"].to_pylist()
    assert trained[0] != trained[2] and 0 not in trained
    assert mapped == [trained[2], 0, trained[0]]  # 'cccc' never appeared in training
    assert valid["C1"].cardinality == train["C1"].cardinality == 3


def test_failure_in_one_file_leaves_no_output(tmp_path, days):
    broken = tmp_path / "day_broken"
    broken.write_text(days[0].read_text() + "0\t1\n")
    with pytest.raises(MalformedLineError, match=r"day_broken:3001"):
        preprocess_criteo([days[1], broken], tmp_path / "pp", scheduler="synchronous", progress=False)
    assert not (tmp_path / "pp").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pp")]
    schema = preprocess_criteo([days[1], broken], tmp_path / "pp", on_bad_lines="skip",
                               scheduler="synchronous", progress=False)
    assert schema.metadata["preprocessing"]["bad_lines"] == 1 and schema.num_rows == 6000


@pytest.mark.parametrize("kwargs, match", [
    ({"min_count": 0}, "min_count=0"),
    ({"feature_crosses": [("C1", "Z9")]}, "not a pair"),
    ({"on_bad_lines": "warn"}, "on_bad_lines='warn'"),
])
def test_bad_arguments_are_named(tmp_path, days, kwargs, match):
    with pytest.raises(ValueError, match=match):
        preprocess_criteo(days, tmp_path / "pp", scheduler="synchronous", progress=False, **kwargs)
    with pytest.raises(FileNotFoundError, match="nope"):
        preprocess_criteo([tmp_path / "nope"], tmp_path / "pp", progress=False)
