"""Criteo-like click logs drawn from a planted model, so the best achievable AUC is known.

Each row has 13 continuous features ``I1..I13`` (count-like, heavy-tailed, some missing), 26
categorical features ``C1..C26`` (int64 ids with Zipf-like frequencies) and a 0/1 ``label``.
The label is Bernoulli(sigmoid(logit)), where the logit adds

* a weight per categorical id (large for frequent ids, shrinking along the tail),
* a weight per continuous feature times its observed, log-standardised value (a constant
  of its own when missing),
* dot products of latent vectors for a few pairs of categorical features (what DLRM's
  interaction layer is for).

By default those pairs join the largest fields, where most ids are too rare for any model to
learn their vectors in one pass: a DLRM then scores about what a logistic regression on the ids
and counts does. ``interactions=s`` plants more pairs between small fields
(`LEARNABLE_PAIRS`, at most a few hundred ids each, so every id is seen often), with latent
vectors of scale ``s`` that do not shrink along the tail. Their dot products average out over
either field alone, so no weight per id can stand in for them: a model that multiplies
embeddings (DLRM) can learn them and a logistic regression cannot. ``interactions=0`` leaves
the data as it was, byte for byte.

The logit is a function of the observed columns only, so the AUC of the true click
probability (saved as ``oracle_auc``) is the best any model can reach on this data.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from data_gen._common import (
    BLOCK_ROWS,
    GENERATOR_VERSION,
    AucAccumulator,
    block_rng,
    blocks,
    head,
    reusable,
    reusable_files,
    write_in_background,
)
from kernels import checks
from sok_tutorial.atomic import atomic_directory, write_json
from sok_tutorial.data.schema import ColumnSchema, Schema
from sok_tutorial.data.writer import DEFAULT_ROW_GROUP_SIZE, DatasetWriter

CONT_NAMES = [f"I{i}" for i in range(1, 14)]
CAT_NAMES = [f"C{i}" for i in range(1, 27)]
LABEL_NAME = "label"

#: Cardinalities of the 26 categorical features of the Criteo Terabyte click logs.
CRITEO_CARDINALITIES = (
    7599500, 33521, 17022, 7339, 20046, 3, 7068, 1377, 63, 5345303, 561810, 242827, 11,
    2209, 10616, 100, 4, 968, 14, 7838519, 2580502, 6878028, 298771, 11951, 97, 35,
)
# Approximate share of missing values of I1..I13 in the Criteo Kaggle data.
_MISSING_RATES = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0005, 0.04, 0.45, 0.04, 0.76, 0.22)
_INTERACTING_PAIRS = ((0, 1), (2, 3), (9, 10), (19, 20))  # categorical pairs with a latent dot term
_LATENT_DIM = 4
#: Pairs of small fields (0-based: C6-C17, C8-C18, C9-C16, C13-C19, C25-C26; at most a few hundred
#: ids each at any scale) whose latent dot products ``interactions=`` plants.
LEARNABLE_PAIRS = ((5, 16), (7, 17), (8, 15), (12, 18), (24, 25))
_MIX = np.uint64(0x9E3779B97F4A7C15)


def scaled_cardinalities(scale: float = 0.01, *, floor: int = 64) -> list[int]:
    """Criteo's cardinalities times `scale`, never below ``min(original, floor)``.

    Example:
        >>> scaled_cardinalities(0.001)[:6]
        [7600, 64, 64, 64, 64, 3]
    """
    checks.fraction("scale", scale, low=1e-9, high=1.0)
    return [max(min(c, floor), math.ceil(c * scale)) for c in CRITEO_CARDINALITIES]


class CriteoLike:
    """The planted model and a block-wise sampler of Criteo-like rows.

    Args:
        cardinalities: 26 vocabulary sizes (default: `scaled_cardinalities(0.01)`).
        zipf_exponent: mean Zipf exponent: the id at rank r of feature f has frequency
            ~ r ** -s_f, with s_f drawn within 15% of this value per feature.
        positive_rate: target share of clicks (the bias is calibrated for it).
        signal: scale of all planted weights (higher -> easier task, higher oracle AUC).
        interactions: scale of the latent vectors of `LEARNABLE_PAIRS` (0: none; module docstring).
        seed: same seed, same model, same rows.
    """

    def __init__(self, cardinalities: Sequence[int] | None = None, *, zipf_exponent: float = 1.1,
                 positive_rate: float = 0.25, signal: float = 1.0, interactions: float = 0.0, seed: int = 0):
        cards = list(scaled_cardinalities() if cardinalities is None else cardinalities)
        if len(cards) != len(CAT_NAMES):
            raise ValueError(f"cardinalities has {len(cards)} entries, expected {len(CAT_NAMES)}")
        self.cardinalities = [checks.positive_int(f"cardinalities[{i}]", c) for i, c in enumerate(cards)]
        self.zipf_exponent = checks.fraction("zipf_exponent", zipf_exponent, low=0.5, high=3.0)
        self.positive_rate = checks.fraction("positive_rate", positive_rate, low=0.01, high=0.99)
        self.signal = checks.fraction("signal", signal, low=0.0, high=10.0)
        self.interactions = checks.fraction("interactions", interactions, low=0.0, high=10.0)
        self.seed = checks.positive_int("seed", seed, allow_zero=True)
        rng = np.random.default_rng([self.seed, 0xC417E0])
        strength = 0.6 * self.signal  # signal=1 gives an oracle AUC near 0.80, as on real Criteo
        # Everything planted is indexed by frequency rank; a random permutation per feature maps
        # rank -> id, so frequent ids are scattered over [0, n) as hashed ids are in real logs.
        self._perm = [rng.permutation(n).astype(np.int64) for n in self.cardinalities]
        self._weights = [self._by_rank(n, rng, 0.35 * strength) for n in self.cardinalities]
        self._latent = {pair: [self._by_rank(self.cardinalities[f], rng, 0.35 * strength, _LATENT_DIM)
                               for f in pair] for pair in _INTERACTING_PAIRS}  # each (dim, n)
        self._log_mu = rng.uniform(0.5, 3.5, 13).astype(np.float32)[:, None]
        self._log_sd = rng.uniform(0.6, 1.6, 13).astype(np.float32)[:, None]
        self._shift = np.zeros((13, 1), np.float32)
        self._shift[1] = 3.0  # like Criteo's I2, a few values go negative
        self._dense_w = (rng.normal(0, 0.3, 13) * strength).astype(np.float32)[:, None]
        self._missing_w = (rng.normal(0, 0.3, 13) * strength).astype(np.float32)[:, None]
        self._missing = np.asarray(_MISSING_RATES, np.float32)[:, None]
        # per-feature exponents, then inverse-CDF constants of a power law on [1, n + 1)
        self.zipf_exponents = self.zipf_exponent * rng.uniform(0.85, 1.15, len(self.cardinalities))
        self.zipf_exponents[np.abs(self.zipf_exponents - 1.0) < 1e-3] += 2e-3  # s = 1 is the log case
        self._zipf_c = [np.float32((n + 1.0) ** (1.0 - s) - 1.0)
                        for n, s in zip(self.cardinalities, self.zipf_exponents)]
        self._zipf_inv = [np.float32(1.0 / (1.0 - s)) for s in self.zipf_exponents]
        if self.interactions:  # a stream of its own: the rest of the model is the same with or without
            pair_rng = np.random.default_rng([self.seed, 0x1A7E])
            for pair in LEARNABLE_PAIRS:
                self._latent[pair] = [self._centred(f, self._by_rank(self.cardinalities[f], pair_rng,
                                                                      self.interactions, _LATENT_DIM, knee=math.inf))
                                      for f in pair]
        self._bias = np.float32(0.0)
        self._bias = self._calibrate_bias()

    @staticmethod
    def _by_rank(n: int, rng: np.random.Generator, scale: float, dim: int = 0, knee: float = 200.0) -> np.ndarray:
        """Per-rank values, shrinking along the tail past rank `knee` (ids seen rarely carry little signal)."""
        values = rng.standard_normal((dim, n) if dim else n, dtype=np.float32)
        values *= scale / np.sqrt(1.0 + np.arange(n, dtype=np.float32) / knee)
        return values

    def rank_probabilities(self, f: int) -> np.ndarray:
        """P(rank r) of feature `f`'s ids, r = 0 .. n-1, under the power law `_draw` samples."""
        n, s = self.cardinalities[f], float(self.zipf_exponents[f])
        below = (np.arange(1, n + 1, dtype=np.float64) + 1.0) ** (1.0 - s) - 1.0  # P(rank < r + 1) * c
        below /= (n + 1.0) ** (1.0 - s) - 1.0
        return np.diff(below, prepend=0.0)

    def _centred(self, f: int, latent: np.ndarray) -> np.ndarray:
        """`latent` ([dim, n] by rank) less its mean over feature `f`'s traffic: then the mean of a
        dot product over either field's ids is 0, so no weight of a single id can stand in for it."""
        return (latent - latent @ self.rank_probabilities(f)[:, None]).astype(np.float32)

    def _calibrate_bias(self) -> np.float32:
        """Pick the bias so the mean click probability is `positive_rate` (bisection on a sample)."""
        logit = self._logit(*self._draw(np.random.default_rng([self.seed, 0xB1A5]), 32_768)[:2])
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if np.mean(1 / (1 + np.exp(-(logit + mid)))) < self.positive_rate:
                lo = mid
            else:
                hi = mid
        return np.float32((lo + hi) / 2)

    # ---------------------------------------------------------------- sampling
    def _draw(self, rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ranks [26, rows] int64, continuous [13, rows] float32 with NaN, uniform [rows])."""
        u = rng.random((len(self.cardinalities), rows), dtype=np.float32)
        ranks = np.empty(u.shape, np.int64)
        for f, n in enumerate(self.cardinalities):
            x = u[f] * self._zipf_c[f]
            x += 1.0  # >= (n + 1) ** (1 - s) > 0; np.log is vectorised, np.log1p is not
            np.log(x, out=x)
            x *= self._zipf_inv[f]
            np.exp(x, out=x)
            np.subtract(x, 1.0, out=x)
            np.clip(x, 0, n - 1, out=x)
            ranks[f] = x  # truncation floors: x >= 0
        # log-logistic counts: exp(mu + sd * logistic noise), the noise by inverse CDF
        cont = rng.random((13, rows), dtype=np.float32)
        np.clip(cont, 1e-7, 1 - 1e-7, out=cont)
        cont = np.log(cont / (1 - cont))
        cont *= self._log_sd
        cont += self._log_mu
        np.exp(cont, out=cont)
        np.floor(cont, out=cont)
        cont -= self._shift
        np.copyto(cont, np.float32(np.nan), where=rng.random((13, rows), dtype=np.float32) < self._missing)
        return ranks, cont, rng.random(rows, dtype=np.float32)

    def _logit(self, ranks: np.ndarray, cont: np.ndarray) -> np.ndarray:
        logit = np.full(ranks.shape[1], self._bias, np.float32)
        for f, table in enumerate(self._weights):
            logit += table[ranks[f]]
        z = cont + (self._shift + 1.0)
        np.log(z, out=z)
        z -= self._log_mu
        z *= self._dense_w / self._log_sd
        np.copyto(z, self._missing_w, where=np.isnan(z))
        logit += z.sum(axis=0)
        for (f, g), (table_f, table_g) in self._latent.items():
            for d in range(_LATENT_DIM):
                logit += table_f[d][ranks[f]] * table_g[d][ranks[g]]
        return logit

    def sample(self, rows: int, block: int = 0) -> dict[str, np.ndarray]:
        """One block of rows: the columns plus ``probability`` (the true click probability)."""
        ranks, cont, u = self._draw(block_rng(self.seed, 1, block), rows)
        p = 1.0 / (1.0 + np.exp(-self._logit(ranks, cont)))
        out: dict[str, np.ndarray] = {LABEL_NAME: (u < p).astype(np.int8)}
        out.update({name: cont[j] for j, name in enumerate(CONT_NAMES)})  # NaN = missing
        out.update({name: perm[ranks[f]] for f, (name, perm) in enumerate(zip(CAT_NAMES, self._perm))})
        out["probability"] = p
        return out

    def iter_blocks(self, num_rows: int, first_block: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """`num_rows` rows in blocks of `BLOCK_ROWS` (the last one shorter), starting at block
        `first_block` of the stream (rows past the end of one dataset make a disjoint held-out set)."""
        checks.positive_int("first_block", first_block, allow_zero=True)
        for index, rows in blocks(checks.positive_int("num_rows", num_rows)):
            yield head(self.sample(BLOCK_ROWS, first_block + index), rows)

    def params(self) -> dict[str, Any]:
        return {"cardinalities": self.cardinalities, "zipf_exponent": self.zipf_exponent,
                "positive_rate": self.positive_rate, "signal": self.signal,
                "interactions": self.interactions, "seed": self.seed}

    def schema(self) -> Schema:
        """Columns; categorical ``key_offset``s place the 26 id ranges back to back in one key space."""
        offsets = np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]]).tolist()
        return Schema([ColumnSchema(LABEL_NAME, "label", "int8")]
                      + [ColumnSchema(n, "continuous", "float32") for n in CONT_NAMES]
                      + [ColumnSchema(n, "categorical", "int64", cardinality=c, key_offset=int(o))
                         for n, c, o in zip(CAT_NAMES, self.cardinalities, offsets)])


def held_out_block(num_rows: int) -> int:
    """The first block past a dataset of `num_rows` rows: pass it as ``first_block`` to draw
    held-out rows from the same model.

    Example:
        >>> held_out_block(1), held_out_block(BLOCK_ROWS), held_out_block(BLOCK_ROWS + 1)
        (1, 1, 2)
    """
    return -(-checks.positive_int("num_rows", num_rows) // BLOCK_ROWS)


def write_criteo_parquet(out_dir: str | Path, num_rows: int, *, cardinalities: Sequence[int] | None = None,
                         zipf_exponent: float = 1.1, positive_rate: float = 0.25, signal: float = 1.0,
                         interactions: float = 0.0, seed: int = 0, first_block: int = 0, num_parts: int = 1,
                         row_group_size: int = DEFAULT_ROW_GROUP_SIZE, overwrite: bool = False, reuse: bool = False,
                         keysets: bool = False, progress: bool = True) -> Schema:
    """Generate `num_rows` Criteo-like rows straight into a parquet dataset directory.

    Missing continuous values are parquet nulls (read back as NaN by pandas). Rows come from
    blocks ``first_block, first_block + 1, ...`` of the seed's stream of `BLOCK_ROWS`-row blocks:
    a validation set for a training set of ``n`` rows is the same call with
    ``first_block=held_out_block(n)`` (same planted model, disjoint rows). With ``keysets=True``
    each part gets its keyset beside it (``<part>.keyset``: the unique keys of its 26 categorical
    columns in the global key space, ``id + key_offset``).

    ``schema.json`` records the generator parameters, ``oracle_auc`` (AUC of the true click
    probability on these rows) and ``positive_rate``. With ``reuse=True`` an existing dataset made
    with identical parameters is returned untouched; otherwise an existing non-empty `out_dir`
    is refused unless ``overwrite=True``.

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp()) / "criteo"
        >>> schema = write_criteo_parquet(out, 1000, progress=False)
        >>> schema.num_rows, len(schema.names_of("categorical")), 0.5 < schema.metadata["oracle_auc"] < 1
        (1000, 26, True)
    """
    checks.positive_int("num_rows", num_rows)
    model = CriteoLike(cardinalities, zipf_exponent=zipf_exponent, positive_rate=positive_rate,
                       signal=signal, interactions=interactions, seed=seed)
    generator = {"name": "criteo_like", "version": GENERATOR_VERSION, "num_rows": num_rows,
                 "first_block": first_block, "num_parts": num_parts, "row_group_size": row_group_size,
                 "keysets": keysets, **model.params()}
    if reuse and (schema := reusable(out_dir, generator)) is not None:
        return schema
    acc = AucAccumulator()
    labels = 0

    def chunks() -> Iterator[dict[str, np.ndarray]]:
        nonlocal labels
        for block in model.iter_blocks(num_rows, first_block):
            acc.update(block.pop("probability"), block[LABEL_NAME])
            labels += int(block[LABEL_NAME].sum())
            for name in CONT_NAMES:  # missing values are stored as parquet nulls
                block[name] = pa.array(block[name], mask=np.isnan(block[name]))
            yield block

    writer = DatasetWriter(out_dir, model.schema(), num_parts=num_parts, total_rows=num_rows,
                           row_group_size=row_group_size, overwrite=overwrite, arg="out_dir",
                           keyset_columns=CAT_NAMES if keysets else ())
    with writer:
        write_in_background(writer.write, chunks(), total=num_rows, count=lambda b: len(b[LABEL_NAME]),
                            progress=progress, desc=f"criteo-like -> {Path(out_dir).name}")
        writer.schema.metadata.update(generator=generator, oracle_auc=acc.auc(), positive_rate=labels / num_rows)
        return writer.close()


# ---------------------------------------------------------------------------- TSV output
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def hex_tokens(f: int, ids: np.ndarray) -> pa.Array:
    """Criteo-style 8-hex-digit tokens for the ids of feature `f` (a bijection per feature)."""
    h = (ids.astype(np.uint64) * _MIX + np.uint64(f) * np.uint64(0x85EBCA77)) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(15)
    b = h.astype(">u4").view(np.uint8).reshape(-1, 4)
    chars = np.empty((len(ids), 8), np.uint8)
    chars[:, 0::2], chars[:, 1::2] = _HEX[b >> 4], _HEX[b & 15]
    offsets = np.arange(0, 8 * len(ids) + 1, 8, dtype=np.int32)
    return pa.StringArray.from_buffers(len(ids), pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()))


def write_criteo_tsv(out_dir: str | Path, num_rows: int, *, num_files: int = 1,
                     cardinalities: Sequence[int] | None = None, zipf_exponent: float = 1.1,
                     positive_rate: float = 0.25, signal: float = 1.0, interactions: float = 0.0, seed: int = 0,
                     overwrite: bool = False, reuse: bool = False, progress: bool = True) -> list[Path]:
    """Write Criteo-format day files ``day_0 .. day_{num_files-1}`` (tab-separated, no header:
    label, 13 integers with empty fields for missing values, 26 hex tokens).

    The directory also gets ``metadata.json`` with the generator parameters and oracle AUC;
    ``reuse=True`` keeps files written earlier with identical parameters. Returns the file paths.
    """
    checks.positive_int("num_rows", num_rows)
    checks.positive_int("num_files", num_files)
    if num_rows < num_files:
        raise ValueError(f"num_rows={num_rows} is less than num_files={num_files}")
    model = CriteoLike(cardinalities, zipf_exponent=zipf_exponent, positive_rate=positive_rate,
                       signal=signal, interactions=interactions, seed=seed)
    generator = {"name": "criteo_like_tsv", "version": GENERATOR_VERSION, "num_rows": num_rows,
                 "num_files": num_files, **model.params()}
    files = [Path(out_dir) / f"day_{i}" for i in range(num_files)]
    if reuse and reusable_files(out_dir, generator) is not None and all(f.is_file() for f in files):
        return files
    acc = AucAccumulator()
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    bounds = [num_rows * i // num_files for i in range(num_files + 1)]
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        sinks = [pcsv.CSVWriter(tmp / f"day_{i}", _tsv_schema(), write_options=options) for i in range(num_files)]
        start = 0

        def write(block: dict[str, np.ndarray]) -> None:
            nonlocal start
            table = _tsv_table(block)
            for i, sink in enumerate(sinks):
                lo, hi = max(bounds[i], start), min(bounds[i + 1], start + table.num_rows)
                if lo < hi:
                    sink.write_table(table.slice(lo - start, hi - lo))
            start += table.num_rows

        def tracked() -> Iterator[dict[str, np.ndarray]]:
            for block in model.iter_blocks(num_rows):
                acc.update(block.pop("probability"), block[LABEL_NAME])
                yield block

        try:
            write_in_background(write, tracked(), total=num_rows, count=lambda b: len(b[LABEL_NAME]),
                                progress=progress, desc=f"criteo-like tsv -> {Path(out_dir).name}")
        finally:
            for sink in sinks:
                sink.close()
        write_json(tmp / "metadata.json", {"generator": generator, "oracle_auc": acc.auc()})
    return files


def _tsv_schema() -> pa.Schema:
    return pa.schema([(LABEL_NAME, pa.int8())] + [(n, pa.int64()) for n in CONT_NAMES]
                     + [(n, pa.string()) for n in CAT_NAMES])


def _tsv_table(block: dict[str, np.ndarray]) -> pa.Table:
    arrays = [pa.array(block[LABEL_NAME])]
    arrays += [pa.array(block[n], from_pandas=True).cast(pa.int64()) for n in CONT_NAMES]
    arrays += [hex_tokens(f, block[n]) for f, n in enumerate(CAT_NAMES)]
    return pa.Table.from_arrays(arrays, schema=_tsv_schema())
