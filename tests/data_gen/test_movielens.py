from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from data_gen.movielens import GENRES, MalformedRatingsError, generate_movielens, read_movielens, write_movielens


@pytest.fixture(scope="module")
def ml():
    return generate_movielens(80_000, num_users=500, num_movies=300, seed=0)


def test_columns_ranges_and_time_order(ml):
    r = ml.ratings
    assert r.column_names == ["userId", "movieId", "genres", "rating", "timestamp"]
    assert pc.min(r["userId"]).as_py() >= 1 and pc.max(r["userId"]).as_py() <= 500
    assert pc.max(r["movieId"]).as_py() <= 300
    assert set(np.unique(r["rating"].to_numpy())) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert np.all(np.diff(r["timestamp"].to_numpy()) >= 0)
    genres = set(pc.list_flatten(r["genres"]).to_pylist())
    assert genres <= set(GENRES) and len(genres) > 10


def test_planted_structure_is_learnable_and_popularity_skewed(ml):
    assert 0.65 < ml.metadata["oracle_auc"] < 0.95
    assert 0.3 < ml.metadata["positive_rate"] < 0.7
    counts = np.sort(np.bincount(ml.ratings["movieId"].to_numpy()))[::-1]
    assert counts[0] > 20 * np.median(counts[counts > 0])
    # genres carry signal: the mean rating differs between genres
    df = ml.ratings.select(["genres", "rating"]).to_pandas().explode("genres")
    means = df.groupby("genres")["rating"].mean()
    assert means.max() - means.min() > 0.2


def test_written_csv_reads_back_identically(tmp_path, ml):
    write_movielens(tmp_path / "ml", 80_000, num_users=500, num_movies=300, seed=0, progress=False)
    back = read_movielens(tmp_path / "ml")
    assert back.ratings.equals(ml.ratings)
    assert back.metadata["oracle_auc"] == pytest.approx(ml.metadata["oracle_auc"])


def test_same_seed_writes_the_same_bytes(tmp_path):
    for name in ("a", "b"):
        write_movielens(tmp_path / name, 5000, num_users=60, num_movies=40, seed=7, progress=False)
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "b").iterdir()) and "ratings.csv" in files
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    write_movielens(tmp_path / "c", 5000, num_users=60, num_movies=40, seed=8, progress=False)
    assert (tmp_path / "c" / "ratings.csv").read_bytes() != (tmp_path / "a" / "ratings.csv").read_bytes()


def test_prefix_property():
    a = generate_movielens(1000, num_users=50, num_movies=40, seed=3).ratings
    b = generate_movielens(70_000, num_users=50, num_movies=40, seed=3).ratings
    assert a.equals(b.slice(0, 1000))


def test_reads_ml_100k_layout(tmp_path):
    (tmp_path / "u.data").write_text("1\t2\t5\t881250949\n2\t1\t3\t881250950\n")
    flags = ["0|0|1" + "|0" * 16, "0|1|0" + "|0" * 16]  # 'unknown', Action, Adventure, ...
    (tmp_path / "u.item").write_text(
        f"1|Toy Story (1995)|01-Jan-1995||http://x|{flags[0]}\n2|GoldenEye (1995)|01-Jan-1995||http://y|{flags[1]}\n")
    ml = read_movielens(tmp_path)
    assert ml.ratings.to_pylist() == [
        {"userId": 1, "movieId": 2, "genres": ["Action"], "rating": 5.0, "timestamp": 881250949},
        {"userId": 2, "movieId": 1, "genres": ["Adventure"], "rating": 3.0, "timestamp": 881250950}]
    assert ml.metadata["layout"] == "ml-100k"


def test_reads_ml_1m_layout(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::1193::5::978300760\n1::661::3::978302109\n")
    (tmp_path / "movies.dat").write_text(
        "1193::One Flew (1975)::Drama\n661::James (1996)::Animation|Children's|Musical\n")
    ml = read_movielens(tmp_path)
    assert ml.ratings["genres"].to_pylist() == [["Drama"], ["Animation", "Children's", "Musical"]]
    assert ml.ratings["rating"].to_pylist() == [5.0, 3.0] and ml.metadata["layout"] == "ml-1m"


def test_unknown_movie_gets_no_genres_and_missing_layout_is_named(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,99,4.5,10\n")
    (tmp_path / "movies.csv").write_text('movieId,title,genres\n1,"A, film",(no genres listed)\n')
    assert read_movielens(tmp_path).ratings["genres"].to_pylist() == [[]]
    with pytest.raises(FileNotFoundError, match="nothing' does not exist: expected a MovieLens directory"):
        read_movielens(tmp_path / "nothing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "ratings.parquet").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no MovieLens layout: expected .* found ratings.parquet") as info:
        read_movielens(tmp_path / "other")
    assert all(name in str(info.value) for name in ("u.data + u.item (ml-100k)", "ratings.dat + movies.dat (ml-1m)",
                                                    "ratings.csv + movies.csv (ml-25m)"))


@pytest.mark.parametrize("kwargs, match", [({"num_users": 0}, "num_users=0"), ({"seed": -2}, "seed=-2")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_movielens(100, **kwargs)
    with pytest.raises(ValueError, match="num_ratings=0"):
        generate_movielens(0)


def _layout(root, layout: str, ratings: list[bytes]) -> None:
    """A MovieLens directory of `layout` with movies 1 and 2 and these ratings lines (no newlines)."""
    root.mkdir()
    if layout == "ml-1m":
        (root / "movies.dat").write_text("1::A (1999)::Drama\n2::B (1999)::Comedy\n")
        (root / "ratings.dat").write_bytes(b"".join(r.replace(b",", b"::") + b"\n" for r in ratings))
    elif layout == "ml-100k":
        flags = "|".join(["0"] * 19)
        (root / "u.item").write_text(f"1|A (1999)|01-Jan-1999||http://a|{flags}\n2|B (1999)|01-Jan-1999||http://b|{flags}\n")
        (root / "u.data").write_bytes(b"".join(r.replace(b",", b"\t") + b"\n" for r in ratings))
    else:
        (root / "movies.csv").write_text("movieId,title,genres\n1,A (1999),Drama\n2,B (1999),Comedy\n")
        (root / "ratings.csv").write_bytes(b"userId,movieId,rating,timestamp\n" + b"".join(r + b"\n" for r in ratings))


LAYOUTS = ["ml-1m", "ml-100k", "ml-25m"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bad, message", [
    (b"1,2.5,4,100", r"movieId='2\.5' is not an integer within int64"),
    (b"9223372036854775808,1,4,100", r"userId='9223372036854775808' is not an integer within int64"),
    (b"1,1,four,100", r"rating='four' is not a finite number"),
    (b"1,1,nan,100", r"rating='nan' is not a finite number"),
    (b"1,1,4,100,7", r"expected 4 fields .* found 5"),
    (b"1,1,4,\xff\xfe", r"not valid UTF-8"),
], ids=["float-id", "id-beyond-int64", "word-rating", "nan-rating", "five-fields", "not-utf8"])
def test_a_bad_ratings_line_names_file_and_line_in_every_layout(tmp_path, layout, bad, message):
    _layout(tmp_path / "ml", layout, [b"1,1,4,100", bad, b"2,2,3,101"])
    name, line = {"ml-1m": ("ratings.dat", 2), "ml-100k": ("u.data", 2), "ml-25m": ("ratings.csv", 3)}[layout]
    with pytest.raises(MalformedRatingsError, match=rf"{name}:{line}: {message}"):
        read_movielens(tmp_path / "ml")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_reads_the_same_ratings_and_refuses_an_empty_file(tmp_path, layout):
    _layout(tmp_path / "ml", layout, [b"1,1,4,100", b"2,2,3.5,101"])
    ml = read_movielens(tmp_path / "ml")
    assert ml.ratings.select(["userId", "movieId", "rating", "timestamp"]).to_pylist() == [
        {"userId": 1, "movieId": 1, "rating": 4.0, "timestamp": 100},
        {"userId": 2, "movieId": 2, "rating": 3.5, "timestamp": 101}]
    _layout(tmp_path / "empty", layout, [])
    with pytest.raises(MalformedRatingsError, match=r"holds no ratings"):
        read_movielens(tmp_path / "empty")


def test_movies_csv_that_is_not_utf8_names_its_line(tmp_path):
    _layout(tmp_path / "ml", "ml-25m", [b"1,1,4,100"])
    (tmp_path / "ml" / "movies.csv").write_bytes(b"movieId,title,genres\n1,A,Drama\n2,B\xff,Comedy\n")
    with pytest.raises(MalformedRatingsError, match=r"movies.csv:3: not valid UTF-8"):
        read_movielens(tmp_path / "ml")


def test_a_ratings_csv_header_may_carry_a_byte_order_mark_or_quotes(tmp_path):
    _layout(tmp_path / "ml", "ml-25m", [b"1,1,4,100"])
    (tmp_path / "ml" / "ratings.csv").write_bytes(b'\xef\xbb\xbf"userId","movieId","rating","timestamp"\n1,1,4,100\n')
    assert read_movielens(tmp_path / "ml").ratings.num_rows == 1
    (tmp_path / "ml" / "ratings.csv").write_bytes(b"user,movie,rating,time\n1,1,4,100\n")
    with pytest.raises(MalformedRatingsError, match=r"ratings.csv:1: expected the header"):
        read_movielens(tmp_path / "ml")
