"""MovieLens-like ratings with a planted preference structure, and readers for real downloads.

Every path gives the same table: ``userId`` (int64), ``movieId`` (int64), ``genres`` (list of
genre names), ``rating`` (float32 stars) and ``timestamp`` (int64 seconds), in time order.
Nothing is ever downloaded: point `read_movielens` at a directory you fetched yourself in one of
the layouts ml-100k (``u.data`` + ``u.item``), ml-1m (``ratings.dat`` + ``movies.dat``, ``::``
separated) or ml-25m / ml-latest (``ratings.csv`` + ``movies.csv``).

The planted model: users and movies have latent vectors; a movie's vector mixes the vectors of
its genres (so genres carry signal); user and movie biases; Zipf-like movie popularity. A rating
is ``rint(3.5 + score + noise)`` clipped to 1..5 stars with Gaussian noise, so the probability of
the binary label ``rating >= 4`` is known exactly and its AUC is saved as ``oracle_auc``.
"""
from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from data_gen._common import (
    BLOCK_ROWS,
    GENERATOR_VERSION,
    AucAccumulator,
    block_rng,
    blocks,
    is_utf8,
    line_blocks,
    reusable_files,
    write_in_background,
)
from kernels import checks
from sok_tutorial.atomic import atomic_directory, read_json, write_json

GENRES = ("Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
          "War", "Western")
COLUMNS = ("userId", "movieId", "genres", "rating", "timestamp")
_NO_GENRES = "(no genres listed)"
_NOISE = 0.9  # std of the rating noise
_START = 946_684_800  # 2000-01-01, seconds
_BLOCK_SECONDS = 7 * 86_400  # each block of ratings covers one week


@dataclass
class MovieLens:
    """Ratings joined with genres (an Arrow table), the movie table and metadata."""

    ratings: pa.Table
    movies: pd.DataFrame
    metadata: dict[str, Any] = field(default_factory=dict)


class MovieLensLike:
    """The planted model; `iter_ratings` samples ratings block by block (any size, little memory).

    Args:
        num_users, num_movies: ids run 1..num_users and 1..num_movies, as in MovieLens.
        latent_dim: size of the user and movie vectors.
        zipf_exponent: movie popularity at rank r is ~ r ** -zipf_exponent.
        seed: same seed, same model, same rows.
    """

    def __init__(self, num_users: int = 6040, num_movies: int = 3706, *, latent_dim: int = 8,
                 zipf_exponent: float = 0.9, seed: int = 0):
        self.num_users = checks.positive_int("num_users", num_users)
        self.num_movies = checks.positive_int("num_movies", num_movies)
        self.latent_dim = checks.positive_int("latent_dim", latent_dim)
        self.zipf_exponent = checks.fraction("zipf_exponent", zipf_exponent, low=0.0, high=3.0)
        self.seed = checks.positive_int("seed", seed, allow_zero=True)
        rng = np.random.default_rng([self.seed, 0x1E45])
        genre_pop = rng.dirichlet(np.full(len(GENRES), 0.8))
        self.movie_genres = [np.sort(rng.choice(len(GENRES), k, replace=False, p=genre_pop))
                             for k in rng.integers(1, 4, num_movies)]
        genre_vec = rng.normal(0, 0.45, (len(GENRES), latent_dim))
        self._movie_vec = np.stack([genre_vec[g].mean(axis=0) for g in self.movie_genres])
        self._movie_vec += rng.normal(0, 0.25, self._movie_vec.shape)
        self._user_vec = rng.normal(0, 0.6, (num_users, latent_dim))
        self._user_bias = rng.normal(0, 0.35, num_users)
        pop = np.arange(1, num_movies + 1, dtype=np.float64) ** -zipf_exponent
        self._movie_pop = rng.permutation(pop / pop.sum())
        self._movie_bias = rng.normal(0, 0.35, num_movies) + 0.15 * np.log(self._movie_pop * num_movies)
        act = rng.lognormal(0, 1.0, num_users)
        self._user_act = act / act.sum()

    def params(self) -> dict[str, Any]:
        return {"num_users": self.num_users, "num_movies": self.num_movies, "latent_dim": self.latent_dim,
                "zipf_exponent": self.zipf_exponent, "seed": self.seed}

    def movies(self) -> pd.DataFrame:
        return pd.DataFrame({"movieId": np.arange(1, self.num_movies + 1, dtype=np.int64),
                             "title": [f"Movie {i}" for i in range(1, self.num_movies + 1)],
                             "genres": [[GENRES[g] for g in gs] for gs in self.movie_genres]})

    def iter_ratings(self, num_ratings: int) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """Blocks of ``(ratings table [userId, movieId, rating, timestamp], P(rating >= 4))``;
        block ``i`` covers week ``i`` from 2000-01-01, so rows come in time order."""
        num_ratings = checks.positive_int("num_ratings", num_ratings)
        for index, keep in blocks(num_ratings):
            rng, rows = block_rng(self.seed, 3, index), BLOCK_ROWS
            users = rng.choice(self.num_users, rows, p=self._user_act)
            movies = rng.choice(self.num_movies, rows, p=self._movie_pop)
            score = (self._user_bias[users] + self._movie_bias[movies]
                     + np.einsum("ij,ij->i", self._user_vec[users], self._movie_vec[movies]))
            stars = np.clip(np.rint(3.5 + score + rng.normal(0, _NOISE, rows)), 1, 5).astype(np.float32)
            p_like = 0.5 * (1 + _erf(score / (_NOISE * math.sqrt(2))))  # rint(x) >= 4 <=> x >= 3.5
            stamp = np.sort(rng.uniform(_START + index * _BLOCK_SECONDS, _START + (index + 1) * _BLOCK_SECONDS, rows))
            table = pa.table({"userId": users + 1, "movieId": movies + 1, "rating": stars,
                              "timestamp": stamp.astype(np.int64)})
            yield table.slice(0, keep), p_like[:keep]


def _erf(x: np.ndarray) -> np.ndarray:
    """erf without SciPy (Abramowitz & Stegun 7.1.26, absolute error < 1.5e-7)."""
    sign, x = np.sign(x), np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


def generate_movielens(num_ratings: int = 1_000_209, **model: Any) -> MovieLens:
    """MovieLens-like ratings in memory (defaults: the size of ml-1m). `model` goes to `MovieLensLike`.

    Example:
        >>> ml = generate_movielens(2000, num_users=50, num_movies=40)
        >>> ml.ratings.column_names, ml.ratings.num_rows, 0.5 < ml.metadata["oracle_auc"] < 1
        (['userId', 'movieId', 'genres', 'rating', 'timestamp'], 2000, True)
    """
    ml = MovieLensLike(**model)
    acc = AucAccumulator()
    tables = []
    for table, p_like in ml.iter_ratings(num_ratings):
        acc.update(p_like, pc.greater_equal(table["rating"], 4.0).to_numpy())
        tables.append(table)
    ratings = pa.concat_tables(tables)
    movies = ml.movies()
    generator = {"name": "movielens_like", "version": GENERATOR_VERSION, "num_ratings": num_ratings, **ml.params()}
    metadata = {"generator": generator,
                "oracle_auc": acc.auc(),
                "positive_rate": float(pc.mean(pc.greater_equal(ratings["rating"], 4.0).cast(pa.float64())).as_py())}
    return MovieLens(join_genres(ratings, movies), movies, metadata)


def write_movielens(out_dir: str | Path, num_ratings: int = 1_000_209, *, overwrite: bool = False,
                    reuse: bool = False, progress: bool = True, **model: Any) -> Path:
    """Stream MovieLens-like data to `out_dir` in the ml-25m layout (``ratings.csv``,
    ``movies.csv``) plus ``metadata.json``: the synthetic data then goes through the same
    reader as a real download. `model` goes to `MovieLensLike`; ``reuse=True`` keeps a
    directory written earlier with identical parameters."""
    ml = MovieLensLike(**model)
    generator = {"name": "movielens_like", "version": GENERATOR_VERSION,
                 "num_ratings": checks.positive_int("num_ratings", num_ratings), **ml.params()}
    if reuse and reusable_files(out_dir, generator) is not None:
        return Path(out_dir)
    acc = AucAccumulator()
    positives = 0
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        movies = ml.movies()
        movies["genres"] = ["|".join(g) if g else _NO_GENRES for g in movies["genres"]]
        movies.to_csv(tmp / "movies.csv", index=False)
        schema = pa.schema([("userId", pa.int64()), ("movieId", pa.int64()), ("rating", pa.float32()),
                            ("timestamp", pa.int64())])
        with pcsv.CSVWriter(tmp / "ratings.csv", schema,
                            write_options=pcsv.WriteOptions(quoting_style="none", quoting_header="none")) as sink:
            def tracked() -> Iterator[pa.Table]:
                nonlocal positives
                for table, p_like in ml.iter_ratings(num_ratings):
                    liked = pc.greater_equal(table["rating"], 4.0).to_numpy()
                    acc.update(p_like, liked)
                    positives += int(liked.sum())
                    yield table

            write_in_background(sink.write_table, tracked(), total=num_ratings, count=lambda t: t.num_rows,
                                progress=progress, desc=f"movielens-like -> {Path(out_dir).name}")
        write_json(tmp / "metadata.json", {"generator": generator, "oracle_auc": acc.auc(),
                                           "positive_rate": positives / num_ratings})
    return Path(out_dir)


def join_genres(ratings: pa.Table, movies: pd.DataFrame) -> pa.Table:
    """Add the ``genres`` list column to ratings (movies without an entry get an empty list)."""
    lookup = pd.Index(movies["movieId"].to_numpy())
    genre_lists = pa.array(list(movies["genres"]) + [[]], type=pa.list_(pa.string()))
    pos = lookup.get_indexer(ratings["movieId"].to_numpy())
    pos[pos < 0] = len(movies)
    genres = genre_lists.take(pa.array(pos))
    table = ratings.append_column("genres", genres)
    return table.select(list(COLUMNS))


def movielens_layout(path: str | Path) -> str | None:
    """The MovieLens layout a directory holds ("ml-25m", "ml-1m", "ml-100k"), or None.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> movielens_layout(d) is None
        True
        >>> for name in ("u.data", "u.item"):
        ...     _ = (d / name).write_text("")
        >>> movielens_layout(d)
        'ml-100k'
    """
    path = Path(path)
    for layout, files in (("ml-25m", ("ratings.csv", "movies.csv")), ("ml-1m", ("ratings.dat", "movies.dat")),
                          ("ml-100k", ("u.data", "u.item"))):
        if all((path / f).is_file() for f in files):
            return layout
    return None


_EXPECTED = "ratings.csv + movies.csv (ml-25m), ratings.dat + movies.dat (ml-1m) or u.data + u.item (ml-100k)"


def _movies_and_ratings_path(path: Path) -> tuple[pd.DataFrame, Path, dict[str, Any]]:
    """Find the layout, read the (small) movie table and say where the ratings are."""
    if not path.is_dir():
        raise FileNotFoundError(f"path={str(path)!r} {'is not a directory' if path.exists() else 'does not exist'}: "
                                f"expected a MovieLens directory holding {_EXPECTED}")
    if (path / "ratings.csv").is_file() and (path / "movies.csv").is_file():
        try:
            movies = pd.read_csv(path / "movies.csv", dtype={"movieId": np.int64, "title": str, "genres": str})
        except UnicodeDecodeError:
            with open(path / "movies.csv", "rb") as fh:
                line = next(i for i, raw in enumerate(fh, 1) if not is_utf8(raw))
            raise MalformedRatingsError(f"{path / 'movies.csv'}:{line}: not valid UTF-8 text") from None
        movies["genres"] = [[] if not isinstance(g, str) or g == _NO_GENRES else g.split("|") for g in movies["genres"]]
        return movies, path / "ratings.csv", {"layout": "ml-25m", "sep": ",", "header": True}
    if (path / "ratings.dat").is_file() and (path / "movies.dat").is_file():
        movies = pd.read_csv(path / "movies.dat", sep="::", engine="python", header=None,
                             names=["movieId", "title", "genres"], encoding="latin-1")
        movies["genres"] = [[] if g == _NO_GENRES else g.split("|") for g in movies["genres"]]
        return movies, path / "ratings.dat", {"layout": "ml-1m", "sep": "::", "header": False}
    if (path / "u.data").is_file() and (path / "u.item").is_file():
        item = pd.read_csv(path / "u.item", sep="|", header=None, encoding="latin-1")
        flags = item.iloc[:, -19:].to_numpy().astype(bool)  # 'unknown' then the 18 genres
        movies = pd.DataFrame({"movieId": item[0].astype(np.int64), "title": item[1],
                               "genres": [[GENRES[j - 1] for j in np.flatnonzero(row) if j] for row in flags]})
        return movies, path / "u.data", {"layout": "ml-100k", "sep": "\t", "header": False}
    found = sorted(p.name for p in path.iterdir())
    raise FileNotFoundError(f"path={str(path)!r} holds no MovieLens layout: expected {_EXPECTED}; found "
                            + (", ".join(found[:8]) + (" ..." if len(found) > 8 else "") if found else "nothing"))


class MalformedRatingsError(ValueError):
    """A line of a MovieLens ratings file is not a rating; the message names file and line."""


_RATING_TYPES = {"userId": pa.int64(), "movieId": pa.int64(), "rating": pa.float32(), "timestamp": pa.int64()}
_INT64 = re.compile(r"-?[0-9]+")


def iter_movielens(path: str | Path, *, chunk_bytes: int = 64 << 20) -> Iterator[pa.Table]:
    """Stream a MovieLens directory as joined tables (ratings files larger than memory work).

    Every field is parsed strictly: ids and timestamps must be integers within int64, ratings
    numbers, four fields a line; anything else raises `MalformedRatingsError` naming the file and
    the line, as does a ratings file without a single rating.
    """
    path = Path(path)
    checks.positive_int("chunk_bytes", chunk_bytes)
    movies, ratings_path, layout = _movies_and_ratings_path(path)
    rows = 0
    for table in _ratings(ratings_path, layout["sep"], layout["header"], chunk_bytes):
        rows += table.num_rows
        yield join_genres(table, movies)
    if not rows:
        raise MalformedRatingsError(f"{ratings_path}: holds no ratings")


def _ratings(path: Path, sep: str, header: bool, chunk_bytes: int) -> Iterator[pa.Table]:
    """The ratings of `path` in blocks of whole lines, each parsed by pyarrow (``::`` becomes a tab:
    pyarrow splits on one character), and line by line only where pyarrow refuses a block."""
    lines_before = 0
    with open(path, "rb") as fh:
        if header:
            first = fh.readline().decode("utf-8-sig", "replace").strip()  # (a byte-order mark may lead)
            lines_before = 1
            if [n.strip().strip('"') for n in first.split(sep)] != list(_RATING_TYPES):
                raise MalformedRatingsError(f"{path}:1: expected the header {sep.join(_RATING_TYPES)!r}, found "
                                            f"{first!r}")
        for block in line_blocks(fh, chunk_bytes):
            table = _parse_ratings(block.replace(b"::", b"\t") if sep == "::" else block, path, lines_before, sep)
            lines_before += block.count(b"\n") + (not block.endswith(b"\n"))
            if table.num_rows:
                yield table


def _parse_ratings(block: bytes, path: Path, lines_before: int, sep: str) -> pa.Table:
    delimiter = "\t" if sep == "::" else sep
    ends = np.flatnonzero(np.frombuffer(block, np.uint8) == 10)
    longest = int(np.diff(np.concatenate([[-1], ends, [len(block)]])).max()) + 2
    try:
        table = pcsv.read_csv(io.BytesIO(block), read_options=pcsv.ReadOptions(
            column_names=list(_RATING_TYPES), block_size=max(1 << 20, longest)),
            parse_options=pcsv.ParseOptions(delimiter=delimiter, quote_char=False),
            convert_options=pcsv.ConvertOptions(column_types=_RATING_TYPES))
        if not any(table[n].null_count for n in _RATING_TYPES) and pc.all(pc.is_finite(table["rating"])).as_py() \
                in (True, None):
            return table
    except pa.ArrowInvalid:
        pass
    for i, raw in enumerate(block.split(b"\n"), start=lines_before + 1):  # the slow path: which line, what
        if raw.strip():
            _check_rating_line(raw, path, i, sep, delimiter)
    last = lines_before + block.count(b"\n")
    raise MalformedRatingsError(f"{path}: lines {lines_before + 1}-{last} could not be read as ratings")  # (pyarrow
    # refused a block whose every line passed the checks above)


def _check_rating_line(raw: bytes, path: Path, line: int, sep: str, delimiter: str) -> None:
    if not is_utf8(raw):
        raise MalformedRatingsError(f"{path}:{line}: not valid UTF-8 text")
    fields = raw.decode("utf-8").rstrip("\r").split(delimiter)
    shown = sep.join(fields)
    if len(fields) != 4:
        raise MalformedRatingsError(f"{path}:{line}: expected 4 fields separated by {sep!r} (userId, movieId, "
                                    f"rating, timestamp), found {len(fields)}: {shown[:200]!r}")
    for name, value in zip(_RATING_TYPES, fields):
        if name == "rating":
            try:
                ok = math.isfinite(float(value))
            except ValueError:
                ok = False
            if not ok:
                raise MalformedRatingsError(f"{path}:{line}: rating={value!r} is not a finite number")
        elif not _INT64.fullmatch(value.strip()) or not -2**63 <= int(value) < 2**63:
            raise MalformedRatingsError(f"{path}:{line}: {name}={value!r} is not an integer within int64")


def read_movielens(path: str | Path) -> MovieLens:
    """Read a MovieLens directory (ml-100k, ml-1m or ml-25m layout, or `write_movielens` output)."""
    path = Path(path)
    movies, _, layout = _movies_and_ratings_path(path)
    ratings = pa.concat_tables(iter_movielens(path))
    order = pc.sort_indices(ratings, [("timestamp", "ascending")])  # stable: ties keep file order
    metadata = read_json(path / "metadata.json", "dataset metadata") if (path / "metadata.json").is_file() else {}
    metadata.setdefault("layout", layout["layout"])
    return MovieLens(ratings.take(order), movies, metadata)
