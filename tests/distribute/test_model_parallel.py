"""Model-parallel tables equal one device: the same global batches on N = 1, 2, 4 replicas
(logical CPU devices, one process each) and on 2 worker processes give the same per-step
losses and the same table rows, for the row-, table-, column-wise and grid shardings, both
combiners, SGD, Adam and LazyAdam.

The runs are `sok_tutorial.examples.train_sharded` processes (a process can hold only one
replica count: TF's collective group keys clash across strategies of different sizes).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from sok_tutorial.launch import worker_environments

CASES = ["sharding=row,combiner=sum,optimizer=sgd",
         "sharding=row,combiner=mean,optimizer=lazyadam",
         "sharding=table,combiner=sum,optimizer=lazyadam",
         "sharding=table,combiner=mean,optimizer=sgd",
         "sharding=row,static=1,optimizer=lazyadam",
         "sharding=table,layer=all2all,optimizer=sgd"]
COLUMN = ["sharding=column,optimizer=adam,dim=6",  # slices 3 + 3 on 2 replicas, 2 + 2 + 1 + 1 on 4
          "sharding=column,static=1,combiner=mean,optimizer=sgd,dim=5",  # 3 + 2, 2 + 1 + 1 + 1
          "sharding=column,optimizer=lazyadam,exchange=all_reduce"]
GRID = ["sharding=row_column,optimizer=lazyadam,dim=5",  # 2 x 2 on 4 replicas: slices 3 + 2
        "sharding=row_column,static=1,optimizer=sgd,exchange=all_reduce"]
RUNS = {  # name -> (replicas or "workers:N", cases)
    "n1": (1, CASES + COLUMN + GRID), "n2": (2, CASES + COLUMN), "n4": (4, CASES[:4] + COLUMN + GRID),
    "workers2": ("workers:2", [CASES[0], CASES[1], CASES[3]])}
MODULE = [sys.executable, "-m", "sok_tutorial.examples.train_sharded", "--steps", "6"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def _tag(case: str) -> str:
    return case.replace(",", "_").replace("=", "-")


def _command(replicas: object, cases: list[str], out: Path) -> list[str]:
    args = [a for c in cases for a in ("--case", c)] + ["--out", str(out)]
    if isinstance(replicas, str):
        workers = replicas.split(":")[1]
        return [sys.executable, "-m", "sok_tutorial.launch", "--workers", workers, *MODULE[1:], *args]
    return [*MODULE, "--replicas", str(replicas), *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("model_parallel")

    def run(name: str) -> subprocess.CompletedProcess:
        replicas, cases = RUNS[name]
        return subprocess.run(_command(replicas, cases, out / name), env=ENV, capture_output=True, text=True,
                              timeout=600)

    with ThreadPoolExecutor(2) as pool:
        for name, done in zip(RUNS, pool.map(run, RUNS)):
            assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


def _load(out: Path, name: str, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    files = sorted(out.glob(f"{name}.{_tag(case)}.rank*.npz"))
    assert files, f"no output of {name} {case}"
    parts = [np.load(f) for f in files]
    keys = np.concatenate([p["keys"] for p in parts])
    vectors = np.concatenate([p["vectors"] for p in parts])
    assert len(np.unique(keys)) == len(keys), "a key is stored on two shards"
    order = np.argsort(keys)
    return parts[0]["losses"], keys[order], vectors[order]


@pytest.mark.parametrize("name,case", [(n, c) for n in ("n2", "n4", "workers2") for c in RUNS[n][1]])
def test_n_replicas_train_like_one(runs: Path, name: str, case: str) -> None:
    losses_1, keys_1, table_1 = _load(runs, "n1", case)
    losses_n, keys_n, table_n = _load(runs, name, case)
    assert len(losses_n) == len(losses_1) == 6
    np.testing.assert_allclose(losses_n, losses_1, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(keys_n, keys_1)
    np.testing.assert_allclose(table_n, table_1, rtol=0, atol=2e-6)
    assert np.abs(table_1).max() > 0 and len(np.unique(losses_1)) > 1  # something trained


def test_shards_split_memory(runs: Path) -> None:
    sizes = {n: int(np.load(next(runs.glob(f"{n}.{_tag(CASES[0])}.rank0.npz")))["bytes_per_replica"])
             for n in ("n1", "n2", "n4")}
    for n in (2, 4):  # each replica holds 1/n of the rows and key index, plus its own 8-byte row count
        assert 0 <= sizes[f"n{n}"] * n - sizes["n1"] <= 8 * n and sizes["n1"] > 10_000


def _wait(procs: list[subprocess.Popen], limit: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + limit
    out = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a worker still runs after {limit} s: the survivors hang")
        out.append((p.returncode, text))
    return out


def test_launcher_stops_all_when_a_worker_dies() -> None:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sok_tutorial.launch", "--workers", "2", *MODULE[1:],
                           "--steps", "40", "--die-at-step", "2"], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and time.monotonic() - start < 90
    assert "worker 1 exit code 17" in done.stderr, done.stderr[-2000:]
    assert "[rank 1] worker 1: exiting at step 2" in done.stdout


def test_survivor_exits_with_clear_error_without_launcher() -> None:
    """Started by hand (no launcher to stop it), the surviving worker fails fast and says why."""
    procs = [subprocess.Popen([*MODULE, "--steps", "40", "--die-at-step", "2", "--timeout", "15"],
                              env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for env in worker_environments(2)]
    (code_0, text_0), (code_1, _) = _wait(procs, 90)
    assert code_1 == 17
    assert code_0 != 0 and "a peer stopped answering" in text_0, text_0[-2000:]


def test_unreachable_worker_is_a_clear_error() -> None:
    env = worker_environments(2)[0]  # worker 1 is never started
    start = time.monotonic()
    done = subprocess.run([*MODULE, "--timeout", "3"], env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
                          capture_output=True, text=True, timeout=90)
    assert done.returncode != 0 and time.monotonic() - start < 60
    assert "worker 1 at localhost:" in done.stderr and "unreachable" in done.stderr, done.stderr[-2000:]


def test_checkpoint_restores_onto_another_replica_count(runs: Path, tmp_path: Path) -> None:
    """Saved from 2 replicas (one process) and from 2 worker processes (a file per worker),
    restored on 4 replicas and on 1: training continues identically."""
    case = ["--case", CASES[1]]
    saves = {"ckpt": [*MODULE, "--replicas", "2", *case, "--save", str(tmp_path / "ckpt")],
             "ckpt_workers": [sys.executable, "-m", "sok_tutorial.launch", "--workers", "2", *MODULE[1:], *case,
                              "--save", str(tmp_path / "ckpt_workers")]}
    with ThreadPoolExecutor(2) as pool:
        for done in pool.map(lambda c: subprocess.run(c, env=ENV, capture_output=True, text=True, timeout=300),
                             saves.values()):
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "ckpt_workers" / "tables").iterdir()) == ["0.worker0.npz",
                                                                                       "0.worker1.npz"]

    def resume(run: tuple[str, int]) -> subprocess.CompletedProcess:
        ckpt, n = run
        return subprocess.run([*MODULE, "--replicas", str(n), *case, "--restore", str(tmp_path / ckpt),
                               "--out", str(tmp_path / f"{ckpt}-resumed{n}")], env=ENV, capture_output=True,
                              text=True, timeout=300)

    with ThreadPoolExecutor(2) as pool:
        for done in pool.map(resume, [("ckpt", 1), ("ckpt", 4), ("ckpt_workers", 1)]):
            assert done.returncode == 0, done.stderr[-3000:]
    losses_1, keys_1, table_1 = _load(tmp_path, "ckpt-resumed1", CASES[1])
    for other in ("ckpt-resumed4", "ckpt_workers-resumed1"):
        losses_n, keys_n, table_n = _load(tmp_path, other, CASES[1])
        np.testing.assert_allclose(losses_n, losses_1, atol=2e-6)
        np.testing.assert_array_equal(keys_n, keys_1)
        np.testing.assert_allclose(table_n, table_1, atol=2e-6)
    fresh = _load(runs, "n1", CASES[1])[0]  # the same batches from scratch
    assert losses_1[0] != pytest.approx(fresh[0], abs=1e-4)  # the restore really loaded trained state
