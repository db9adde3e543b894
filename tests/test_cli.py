from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sok_tutorial.data.schema import Schema


def _run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_info_reports_versions_devices_and_gpu_libraries():
    out = _run("-m", "sok_tutorial", "info")
    assert out.returncode == 0, out.stderr
    for key in ("tensorflow", "keras", "tf devices", "cupy", "cudf", "default device"):
        assert any(line.startswith(key) for line in out.stdout.splitlines()), out.stdout
    assert "CPU" in out.stdout


def test_data_gen_cli_round_trip(tmp_path):
    out = _run("-m", "data_gen", "criteo", str(tmp_path / "c"), "--rows", "3000", "--parts", "2",
               "--scale", "0.001", "--quiet")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rows"] == 3000 and len(Schema.load(tmp_path / "c").parts) == 2
    out = _run("-m", "data_gen", "criteo-tsv", str(tmp_path / "t"), "--rows", "2000", "--files", "2",
               "--scale", "0.001", "--quiet")
    assert out.returncode == 0, out.stderr
    out = _run("-m", "data_gen", "preprocess-criteo", str(tmp_path / "p"), str(tmp_path / "t" / "day_0"),
               str(tmp_path / "t" / "day_1"), "--cross", "C1:C2", "--scheduler", "synchronous", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "C1_C2" in Schema.load(tmp_path / "p").names


@pytest.mark.parametrize("args", [["criteo", "X", "--rows", "0"], ["sok", "X", "--samples", "5", "--slot-num", "0"]])
def test_data_gen_cli_bad_input_fails_with_the_argument_named(tmp_path, args):
    args[1] = str(tmp_path / "x")
    out = _run("-m", "data_gen", *args, "--quiet")
    assert out.returncode != 0 and ("rows=0" in out.stderr or "slot_num=0" in out.stderr)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("groups,missing", [("torchrec_shape", "bench_torchrec.py"),
                                            ("dlrm", "bench_torchrec_dlrm.py"), ("eviction,nope", None)])
def test_the_embedding_benchmark_refuses_bad_groups_and_peers_before_any_round(tmp_path, groups, missing):
    """An unknown group, or a --peers folder without the peer a group runs, stops the benchmark at once
    (the peers run after our rounds, minutes later), naming the option and the value."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "embedding.py"
    out = _run(str(script), "--group", groups, "--torchrec", sys.executable, "--peers", str(tmp_path),
               "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    expected = f"--peers='{tmp_path}' holds no {missing}" if missing else "argument --group: 'eviction,nope'"
    assert expected in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()
