"""The exported predictor takes integer ids, numbers and lists as given, and refuses any value it
would have to convert (a float id, a numeric string, a bool), naming the column and the types."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pd = pytest.importorskip("pandas")

from sok_tutorial.data import ParquetLoader, Workflow, to_parquet_dataset  # noqa: E402
from sok_tutorial.models import EmbeddingMLP  # noqa: E402
from sok_tutorial.training import export_model, load_export  # noqa: E402

ROWS = 64
GENRES = ["Action", "Comedy", "Drama", "Horror"]


def _raw(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "userId": pa.array(rng.integers(1, 20, ROWS), pa.int64()),
        "movieId": pa.array(rng.integers(100, 130, ROWS), pa.int64()),
        "genres": pa.array([list(rng.choice(GENRES, rng.integers(0, 3), replace=False)) for _ in range(ROWS)],
                           pa.list_(pa.string())),
        "tags": pa.array([rng.integers(1, 9, rng.integers(1, 4)).tolist() for _ in range(ROWS)], pa.list_(pa.int64())),
        "price": pa.array(rng.uniform(0, 10, ROWS), pa.float64()),
        "rating": pa.array(rng.integers(1, 6, ROWS).astype(np.float32)),
    })


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export-types")
    raw = _raw()
    workflow = Workflow(cat_names=["userId", "movieId"], list_names=["genres", "tags"], cont_names=["price"],
                        label=("rating", 4.0), label_name="liked").fit(raw)
    to_parquet_dataset(workflow.transform(raw), root / "data", **workflow.column_kinds(), progress=False)
    features, _ = next(iter(ParquetLoader(root / "data", ROWS, ["liked"], cat_names=["userId", "movieId"],
                                          list_names=["genres", "tags"], cont_names=["price"], shuffle=False)))
    keras.utils.set_random_seed(0)
    model = EmbeddingMLP(workflow.categorify.cardinalities, dims=4, multi_hot=["genres", "tags"],
                         cont_names=["price"], hidden=[8])
    expected = tf.sigmoid(model(features, training=False)).numpy().ravel()
    export_model(model, workflow, root / "export", sample=features)
    return root / "export", raw, expected, workflow


def _columns(raw: pa.Table) -> dict:
    return {n: raw[n].to_pylist() for n in ("userId", "movieId", "genres", "tags", "price")}


def test_graph_records_every_table_with_rows_and_width(exported):
    path, _, _, workflow = exported
    graph = json.loads((path / "graph.json").read_text())
    cards = workflow.categorify.cardinalities
    assert graph["tables"] == [{"layer": f"embedding_{n}", "rows": cards[n], "dim": 4}
                               for n in ("userId", "movieId", "genres", "tags")]
    assert graph["inputs"] == {"userId": "int64", "movieId": "int64", "genres": "string", "tags": "string",
                               "price": "float32"}


def test_every_integer_form_predicts_the_same(exported):
    path, raw, expected, _ = exported
    predictor = load_export(path)
    columns = _columns(raw)
    frame = pd.DataFrame(columns)
    forms = {
        "python lists": columns,
        "numpy int32 and float32": {**columns, "userId": np.array(columns["userId"], np.int32),
                                    "movieId": np.array(columns["movieId"], np.uint16),
                                    "price": np.array(columns["price"], np.float32)},
        "pandas series": {n: frame[n] for n in frame.columns},
        "pandas frame": frame,
        "arrow table": raw,
        "list of dicts": raw.select(list(columns)).to_pylist(),
        "joined strings": {**columns, "genres": ["|".join(g) for g in columns["genres"]],
                           "tags": ["|".join(map(str, t)) for t in columns["tags"]]},
        "pandas categorical ids": frame.astype({"userId": "category"}),
    }
    for name, rows in forms.items():
        got = predictor.predict(rows)
        assert got.shape == (ROWS,) and np.abs(got - expected).max() < 1e-6, name
    whole = predictor.predict({**columns, "price": [round(p) for p in columns["price"]]})  # ints for a float input
    assert whole.shape == (ROWS,) and np.all((whole > 0) & (whole < 1))


@pytest.mark.parametrize("column, values, found, expected", [
    ("userId", lambda ids: [i + 0.5 for i in ids], "double", "int64"),
    ("userId", lambda ids: np.asarray(ids, np.float64), "double", "int64"),  # whole numbers, still floats
    ("userId", lambda ids: [str(i) for i in ids], "string", "int64"),
    ("userId", lambda ids: [i % 2 == 0 for i in ids], "bool", "int64"),
    ("userId", lambda ids: pd.Series(ids, dtype="float64"), "double", "int64"),
    ("movieId", lambda ids: [[i] for i in ids], "list<item: int64>", "int64"),
    ("price", lambda p: [f"{v:.2f}" for v in p], "string", "float32"),
    ("price", lambda p: [v > 5 for v in p], "bool", "float32"),
    ("tags", lambda t: [[v + 0.5 for v in vs] for vs in t], "list<item: double>", "string"),
    ("genres", lambda g: [0.5] * len(g), "double", "string"),
], ids=["float", "whole-float", "numeric-string", "bool", "pandas-float", "list-for-id", "price-string",
        "price-bool", "float-tags", "float-genres"])
def test_values_that_need_conversion_are_refused(exported, column, values, found, expected):
    path, raw, _, _ = exported
    predictor = load_export(path)
    rows = _columns(raw)
    rows[column] = values(rows[column])
    with pytest.raises(ValueError, match=rf"column '{column}': got {found} values, expected {expected}"):
        predictor.predict(rows)


def test_mixed_missing_and_uneven_columns_are_refused(exported):
    path, raw, _, _ = exported
    predictor = load_export(path)
    rows = _columns(raw)
    with pytest.raises(ValueError, match=r"column 'userId': values of mixed or unsupported types, expected int64"):
        predictor.predict({**rows, "userId": [1, "alice"] + rows["userId"][2:]})
    with pytest.raises(ValueError, match=r"column 'userId': values of mixed or unsupported types, expected int64"):
        predictor.predict({**rows, "userId": np.array([1, object()] + rows["userId"][2:], dtype=object)})
    with pytest.raises(ValueError, match=r"column 'movieId': 1 missing value\(s\), expected an int64 id"):
        predictor.predict({**rows, "movieId": [None] + rows["movieId"][1:]})
    with pytest.raises(ValueError, match=r"column 'userId': got uint64 values, expected int64 \(.*not in range"):
        predictor.predict({**rows, "userId": np.full(ROWS, 2**64 - 1, np.uint64)})
    with pytest.raises(ValueError, match="columns differ in length"):
        predictor.predict({**rows, "price": rows["price"][:3]})
    one = {n: v[0] for n, v in rows.items()}
    assert predictor.predict([one]).shape == (1,)
    with pytest.raises(ValueError, match="column 'userId': got double values, expected int64"):
        predictor.predict([{**one, "userId": 1.0}])
    missing_price = predictor.predict({**rows, "price": [None] + rows["price"][1:]})  # NaN, as before
    assert missing_price.shape == (ROWS,)
