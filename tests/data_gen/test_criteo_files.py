from __future__ import annotations

import gzip
import os

import pyarrow as pa
import pytest

import data_gen.criteo_files as criteo_files
from data_gen.criteo_tsv import MalformedLineError, find_criteo_files, iter_criteo_tsv, take_criteo_rows

EXPECTED_NAMES = ("day_0", "train.txt")


def _line(day: int, i: int) -> bytes:
    """A valid Criteo row whose first categorical token names its day and position."""
    ints = [str((i * 7 + k) % 50) if (i + k) % 5 else "" for k in range(13)]
    cats = [f"{day:02x}{i:06x}"] + [f"{(i * 31 + k) % 97:08x}" for k in range(1, 26)]
    return ("\t".join([str(i % 2), *ints, *cats]) + "\n").encode()


def _write(path, lines: list[bytes]) -> None:
    data = b"".join(lines)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def _days(root, sizes: list[int], gzipped: tuple[int, ...] = ()) -> list[list[bytes]]:
    root.mkdir(parents=True, exist_ok=True)
    days = [[_line(d, i) for i in range(n)] for d, n in enumerate(sizes)]
    for d, lines in enumerate(days):
        _write(root / (f"day_{d}.gz" if d in gzipped else f"day_{d}"), lines)
    return days


def _lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


# ------------------------------------------------------------------------------ find_criteo_files
def test_day_files_come_in_numeric_order_gzipped_or_not(tmp_path):
    for name in ("day_10", "day_2", "day_1.gz", "day_9.gz", "readme.txt", "day_x", "day_3.csv"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "day_4").mkdir()  # a directory is not a day file
    assert [p.name for p in find_criteo_files(tmp_path)] == ["day_1.gz", "day_2", "day_9.gz", "day_10"]
    assert all(p.parent == tmp_path for p in find_criteo_files(str(tmp_path)))


@pytest.mark.parametrize("name", ["train.txt", "train.txt.gz"])
def test_kaggle_layout(tmp_path, name):
    for other in (name, "test.txt", "readme.txt"):
        (tmp_path / other).write_bytes(b"")
    assert find_criteo_files(tmp_path) == [tmp_path / name]


def _names_expected(message: str, path) -> None:
    assert repr(str(path)) in message and all(n in message for n in EXPECTED_NAMES), message


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        find_criteo_files(tmp_path / "nowhere")
    _names_expected(str(info.value), tmp_path / "nowhere")


def test_a_file_is_not_a_directory(tmp_path):
    (tmp_path / "train.txt").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="is not a directory") as info:
        find_criteo_files(tmp_path / "train.txt")
    _names_expected(str(info.value), tmp_path / "train.txt")


def test_empty_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="is empty") as info:
        find_criteo_files(tmp_path)
    _names_expected(str(info.value), tmp_path)


@pytest.mark.parametrize("names", [["test.txt", "readme.txt"], ["part-00000.parquet", "schema.json"]])
def test_another_layout_lists_what_is_there(tmp_path, names):
    for name in names:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(FileNotFoundError) as info:
        find_criteo_files(tmp_path)
    _names_expected(str(info.value), tmp_path)
    assert all(n in str(info.value) for n in names)


def test_an_unextracted_archive_says_so(tmp_path):
    name = "criteo-research-kaggle-display-advertising-challenge-dataset.tar.gz"
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=f"extract {name} first") as info:
        find_criteo_files(tmp_path)
    _names_expected(str(info.value), tmp_path)


@pytest.mark.parametrize("names", [["day_0", "day_1", "train.txt"], ["day_0", "day_0.gz"],
                                   ["train.txt", "train.txt.gz"]])
def test_ambiguous_layouts(tmp_path, names):
    for name in names:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ValueError, match=repr(str(tmp_path))):
        find_criteo_files(tmp_path)


# ------------------------------------------------------------------------------ take_criteo_rows
def test_per_day_heads(tmp_path):
    days = _days(tmp_path / "src", [50, 40, 60, 30], gzipped=(1,))
    out = take_criteo_rows(tmp_path / "src", tmp_path / "out", [20, 40, 5], progress=False)
    assert [p.name for p in out] == ["day_0", "day_1", "day_2"]
    for i, n in enumerate([20, 40, 5]):
        assert _lines(out[i]) == days[i][:n]  # byte for byte, the gzipped day included


@pytest.mark.parametrize("name", ["train.txt", "train.txt.gz"])
def test_slices_of_kaggle_train_txt(tmp_path, name):
    (tmp_path / "src").mkdir()
    lines = [_line(0, i) for i in range(100)]
    _write(tmp_path / "src" / name, lines)
    out = take_criteo_rows(tmp_path / "src", tmp_path / "out", [30, 25, 45], progress=False)
    assert [_lines(p) for p in out] == [lines[:30], lines[30:55], lines[55:]]


def test_slices_across_too_few_day_files(tmp_path):
    days = _days(tmp_path / "src", [10, 10], gzipped=(0,))
    out = take_criteo_rows(tmp_path / "src", tmp_path / "out", [7, 7, 4], progress=False)
    flat = days[0] + days[1]
    assert [_lines(p) for p in out] == [flat[:7], flat[7:14], flat[14:18]]


def test_lines_are_copied_not_parsed(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.txt").write_bytes(b"not\ta row\n" + _line(0, 1) + b"no final newline")
    out = take_criteo_rows(tmp_path / "src", tmp_path / "out", [2, 1], progress=False)
    assert _lines(out[0]) == [b"not\ta row\n", _line(0, 1)] and out[1].read_bytes() == b"no final newline\n"
    with pytest.raises(MalformedLineError, match=r"day_0:1: expected 40"):
        list(iter_criteo_tsv(out[0]))


def test_lines_split_across_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(criteo_files, "_BLOCK_BYTES", 100)  # rows are ~250 bytes: every block cuts one
    days = _days(tmp_path / "src", [30, 30], gzipped=(1,))
    out = take_criteo_rows(tmp_path / "src", tmp_path / "out", [13, 29], progress=False)
    assert _lines(out[0]) == days[0][:13] and _lines(out[1]) == days[1][:29]
    out = take_criteo_rows(tmp_path / "src", tmp_path / "slices", [13, 29, 18], progress=False)
    assert b"".join(p.read_bytes() for p in out) == b"".join(days[0] + days[1])


@pytest.mark.parametrize("sizes, rows, message", [
    ([10, 10], [8, 8, 5], r"holds 20 rows in \['day_0', 'day_1.gz'\], fewer than the 21 asked"),
    ([10, 4, 10], [5, 5, 5], r"day_1.gz holds 4 rows, fewer than rows\[1\]=5"),
])
def test_too_few_rows_writes_nothing(tmp_path, sizes, rows, message):
    _days(tmp_path / "src", sizes, gzipped=(1,))
    with pytest.raises(ValueError, match=message):
        take_criteo_rows(tmp_path / "src", tmp_path / "out", rows, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no output, no temporary directory


@pytest.mark.parametrize("rows", [[], [3, 0], [2.5], "12", 5])
def test_bad_rows(tmp_path, rows):
    _days(tmp_path / "src", [10])
    with pytest.raises(ValueError, match="rows"):
        take_criteo_rows(tmp_path / "src", tmp_path / "out", rows, progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_source_names_the_expected_files(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        take_criteo_rows(tmp_path / "src", tmp_path / "out", [5], progress=False)
    _names_expected(str(info.value), tmp_path / "src")


def test_reuse_skips_an_identical_call(tmp_path, monkeypatch):
    src = tmp_path / "src"
    days = _days(src, [20, 20])
    reads = []
    real_open = criteo_files.open_criteo
    monkeypatch.setattr(criteo_files, "open_criteo", lambda path: reads.append(path.name) or real_open(path))

    def take(rows, **kwargs):
        reads.clear()
        return take_criteo_rows(src, tmp_path / "out", rows, progress=False, **kwargs)

    first = take([5, 6])
    mtimes = [p.stat().st_mtime_ns for p in first]
    assert reads == ["day_0", "day_1"]
    again = take([5, 6])
    assert again == first and reads == [] and [p.stat().st_mtime_ns for p in again] == mtimes

    with pytest.raises(FileExistsError, match="overwrite=True"):  # other rows: not the same output
        take([6, 6])
    assert _lines(take([6, 6], overwrite=True)[0]) == days[0][:6] and reads == ["day_0", "day_1"]
    take([6, 6], overwrite=True)
    assert reads == []

    os.utime(src / "day_1", ns=(1, 1))  # a changed source is read again
    assert _lines(take([6, 6], overwrite=True)[1]) == days[1][:6] and reads == ["day_0", "day_1"]

    (tmp_path / "out" / "day_1").write_bytes(b"edited\n")  # a changed output is not reused
    assert _lines(take([6, 6], overwrite=True)[1]) == days[1][:6] and reads == ["day_0", "day_1"]

    take([6, 6], overwrite=True, reuse=False)
    assert reads == ["day_0", "day_1"]


def test_output_is_a_criteo_directory_itself(tmp_path):
    _days(tmp_path / "src", [12, 12, 12])
    out = take_criteo_rows(tmp_path / "src", tmp_path / "out", [10, 10, 10], progress=False)
    assert find_criteo_files(tmp_path / "out") == out


# ------------------------------------------------------------------------------ iter_criteo_tsv on .gz
def test_gzipped_file_reads_as_the_plain_one(tmp_path):
    lines = [_line(0, i) for i in range(300)]
    _write(tmp_path / "day_0", lines)
    _write(tmp_path / "day_0.gz", lines)
    plain = pa.concat_tables(iter_criteo_tsv(tmp_path / "day_0", block_bytes=5000))
    packed = pa.concat_tables(iter_criteo_tsv(tmp_path / "day_0.gz", block_bytes=5000))
    assert packed.num_rows == 300 and packed.equals(plain)


def test_gzipped_file_reports_the_line_of_a_malformed_row(tmp_path):
    lines = [_line(0, i) for i in range(300)]
    lines[211] = b"1\t2\t3\n"
    _write(tmp_path / "day_5.gz", lines)
    with pytest.raises(MalformedLineError, match=r"day_5\.gz:212: expected 40 tab-separated fields, found 3"):
        list(iter_criteo_tsv(tmp_path / "day_5.gz", block_bytes=3000))
    counter: dict[str, int] = {}
    assert sum(t.num_rows for t in iter_criteo_tsv(tmp_path / "day_5.gz", on_bad_lines="skip",
                                                   counter=counter)) == 299
    assert counter == {"rows": 299, "bad_lines": 1}
