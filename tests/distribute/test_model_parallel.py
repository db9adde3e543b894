"""Model-parallel tables equal one device: the same global batches on N = 1, 2, 4 replicas and on
2 worker processes give the same per-step losses and the same table rows, for the row-, table-,
column-wise and grid shardings, both combiners, SGD, Adam and LazyAdam, and checkpoints move
between replica counts.

Every run is `sok_tutorial.examples.train_sharded.train`:
- in this process (the fast tier), on 1, 2 and 4 logical CPU replicas (``strategy_of``);
- as 2 worker processes through the launcher (``multiprocess``): one launcher run trains three
  cases and saves a checkpoint, which this process restores on 1 replica;
- the launcher's failure paths (``slow``): a worker that dies, one started by hand whose peer
  dies, one whose peer never starts; each must end within its deadline, not hang.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sok_tutorial.examples.train_sharded import case_settings, case_tag, parse
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
FORGET = ["sharding=row,eviction_policy=lru,capacity=512,optimizer=lazyadam",
          "sharding=row,eviction_policy=lfu,capacity=128,min_count=2,sketch_width=65536,combiner=mean",
          "sharding=replicated,eviction_policy=lru,capacity=512,optimizer=lazyadam",
          "sharding=replicated,eviction_policy=ttl,capacity=128,min_count=2,sketch_width=65536",
          "sharding=column,eviction_policy=lru,capacity=512,optimizer=adam,dim=6",
          "sharding=row_column,eviction_policy=lfu,capacity=256,min_count=2,sketch_width=65536,dim=5,"
          "optimizer=lazyadam",
          "sharding=row,track_changes=1,min_count=2,sketch_width=65536,optimizer=lazyadam",
          "sharding=column,track_changes=1,static=1,dim=5",
          # table-wise: each replica's slots in buckets of its own, so the same keys are kept as on one
          # device only while no bucket overflows (room); TTL expiry and admission are per key
          "sharding=table,eviction_policy=ttl,capacity=8192,min_count=2,sketch_width=65536,optimizer=lazyadam"]
FAST_FORGET = {2: [FORGET[0], FORGET[3], FORGET[6]],
               4: [FORGET[1], FORGET[2], FORGET[4], FORGET[5], FORGET[7], FORGET[8]]}
# Each layout on 2 and on 4 replicas, each option once in the fast tier; the rest of the matrix is slow.
FAST = {2: [CASES[0], CASES[2], CASES[4], CASES[5], COLUMN[1]], 4: [CASES[1], CASES[3], COLUMN[0], COLUMN[2], *GRID]}
IN_PROCESS = [pytest.param(n, c, marks=() if c in FAST[n] else pytest.mark.slow)
              for n, cases in {2: CASES + COLUMN, 4: CASES[:4] + COLUMN + GRID}.items() for c in cases]
# every layout with a table that forgets (the grid on 2 workers is 2 x 1); the last (LFU with admission) is saved
WORKER_CASES = [CASES[0], CASES[3], FORGET[0], FORGET[2], FORGET[8], FORGET[3], FORGET[4], CASES[1], FORGET[1]]
STEPS = 6
MODULE = [sys.executable, "-m", "sok_tutorial.examples.train_sharded"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
_RUNS: dict[tuple[int, str, str], dict] = {}


def _train(strategy_of, n: int, case: str, restore: str = "", save: str = "", serve: str = "") -> dict:
    """The example's `train` of `case` on `n` in-process replicas (memoised by n, case, restore)."""
    import sok_tutorial as sok
    from sok_tutorial.examples.train_sharded import train

    if (n, case, restore) not in _RUNS or save or serve:
        args = case_settings(parse(["--steps", str(STEPS)]), case)
        args.restore, args.save, args.serve = restore or None, save or None, serve or None
        strategy = strategy_of(n)
        context = sok.Init(global_batch_size=args.global_batch_size, strategy=strategy)
        _RUNS[n, case, restore] = train(args, strategy, context, rank=0, tag=case_tag(case))
    return _RUNS[n, case, restore]


def _batches() -> list:
    from sok_tutorial.examples.train_sharded import synthetic_batches

    args = parse([])
    return synthetic_batches(STEPS, args.global_batch_size, args.slots, args.nnz, args.vocabulary)


def _by_key(result: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(result["keys"])
    return np.asarray(result["losses"]), result["keys"][order], result["vectors"][order]


def _assert_same(run: tuple, reference: tuple) -> None:
    (losses_n, keys_n, table_n), (losses_1, keys_1, table_1) = run, reference
    assert len(losses_n) == len(losses_1) == STEPS
    np.testing.assert_allclose(losses_n, losses_1, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(keys_n, keys_1)
    np.testing.assert_allclose(table_n, table_1, rtol=0, atol=2e-6)
    assert np.abs(table_1).max() > 0 and len(np.unique(losses_1)) > 1  # something trained


@pytest.mark.parametrize("n,case", IN_PROCESS)
def test_n_replicas_train_like_one(strategy_of, n: int, case: str) -> None:
    _assert_same(_by_key(_train(strategy_of, n, case)), _by_key(_train(strategy_of, 1, case)))


@pytest.mark.parametrize("n,case", [pytest.param(n, c, marks=() if c in FAST_FORGET[n] else pytest.mark.slow)
                                    for n in (2, 4) for c in FORGET])
def test_tables_that_forget_train_like_one_device(strategy_of, n: int, case: str) -> None:
    """Eviction, admission and change tracking on a row-sharded or replicated table: the same keys
    kept, evicted and admitted, the same rows and marks as one device."""
    run, one = _train(strategy_of, n, case), _train(strategy_of, 1, case)
    _assert_same(_by_key(run), _by_key(one))
    order_n, order_1 = np.argsort(run["keys"]), np.argsort(one["keys"])
    np.testing.assert_array_equal(run["marks"][order_n], one["marks"][order_1])
    assert run["evicted"] == one["evicted"] and run["unplaced"] == one["unplaced"]
    if "eviction_policy" in case:  # the table forgot keys: evicted them, or (ttl) let them expire
        assert len(one["keys"]) < 4 * 256 and (one["evicted"] > 0 or "ttl" in case)
    if "min_count" in case:
        assert len(one["keys"]) < len(np.unique(np.concatenate([k.ravel() for k, _ in _batches()])))  # some waited


def test_shards_split_memory(strategy_of) -> None:
    sizes = {n: int(_train(strategy_of, n, CASES[0])["bytes_per_replica"]) for n in (1, 2, 4)}
    for n in (2, 4):  # each replica holds 1/n of the rows and key index, plus its own 8-byte row count
        assert 0 <= sizes[n] * n - sizes[1] <= 8 * n and sizes[1] > 10_000


def test_checkpoint_restores_onto_another_replica_count(strategy_of, tmp_path: Path) -> None:
    """Saved from 2 replicas, restored on 4 and on 1: training continues identically."""
    case = CASES[1]
    _train(strategy_of, 2, case, save=str(tmp_path / "ckpt"))
    resumed = {n: _by_key(_train(strategy_of, n, case, restore=str(tmp_path / "ckpt"))) for n in (1, 4)}
    _assert_same(resumed[4], resumed[1])
    fresh = _by_key(_train(strategy_of, 1, case))[0]  # the same batches from scratch
    assert resumed[1][0][0] != pytest.approx(fresh[0], abs=1e-4)  # the restore really loaded trained state


@pytest.mark.parametrize("case", [FORGET[0], FORGET[2]])
def test_deltas_of_a_table_that_forgets_serve_what_one_device_trained(strategy_of, tmp_path: Path, case: str) -> None:
    """Exported halfway, then the rest published as a delta: the served table of 4 replicas (row-wise
    or replicated) holds exactly the keys and vectors one device's table ends with."""
    run = _train(strategy_of, 4, case, serve=str(tmp_path / "four"))
    one = _train(strategy_of, 1, case)
    served, trained = _by_key({"losses": run["losses"], "keys": run["served_keys"],
                               "vectors": run["served_vectors"]}), _by_key(one)
    _assert_same(served, trained)


@pytest.mark.parametrize("case", [FORGET[0], FORGET[8]])
def test_a_table_that_forgets_restores_onto_another_replica_count(strategy_of, tmp_path: Path, case: str) -> None:
    """A table that forgets, row-wise (LRU) or table-wise (TTL), saved from 2 replicas and restored
    on 1 and on 4: each key in its bucket with its mark and optimizer state, so training continues
    identically."""
    _train(strategy_of, 2, case, save=str(tmp_path / "ckpt"))
    resumed = {n: _train(strategy_of, n, case, restore=str(tmp_path / "ckpt")) for n in (1, 4)}
    _assert_same(_by_key(resumed[4]), _by_key(resumed[1]))
    order_4, order_1 = np.argsort(resumed[4]["keys"]), np.argsort(resumed[1]["keys"])
    np.testing.assert_array_equal(resumed[4]["marks"][order_4], resumed[1]["marks"][order_1])
    assert resumed[4]["evicted"] == resumed[1]["evicted"] and (resumed[1]["evicted"] > 0 or "ttl" in case)


def _load_ranks(prefix: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    files = sorted(prefix.parent.glob(f"{prefix.name}.rank*.npz"))
    assert len(files) == 2, f"expected one output per worker: {files}"
    parts = [np.load(f) for f in files]
    if "replicated" in prefix.name:  # every worker holds the whole table: the same one
        first, second = (_by_key(p) for p in parts)
        np.testing.assert_array_equal(first[1], second[1])
        np.testing.assert_array_equal(first[2], second[2])
        return first
    keys = np.concatenate([p["keys"] for p in parts])
    assert len(np.unique(keys)) == len(keys), "a key is stored on two shards"
    return _by_key({"losses": parts[0]["losses"], "keys": keys,
                    "vectors": np.concatenate([p["vectors"] for p in parts])})


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launcher run of 2 worker processes: every case of WORKER_CASES, then a checkpoint."""
    out = tmp_path_factory.mktemp("workers")
    args = [a for c in WORKER_CASES for a in ("--case", c)]
    done = subprocess.run([sys.executable, "-m", "sok_tutorial.launch", "--workers", "2", *MODULE[1:], "--steps",
                           str(STEPS), *args, "--out", str(out / "run"), "--save", str(out / "ckpt")], env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"workers failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", WORKER_CASES)
def test_two_worker_processes_train_like_one_device(strategy_of, workers: Path, case: str) -> None:
    _assert_same(_load_ranks(workers / f"run.{case_tag(case)}"), _by_key(_train(strategy_of, 1, case)))


@pytest.mark.multiprocess
def test_a_checkpoint_of_two_workers_restores_on_one_device(strategy_of, workers: Path, tmp_path: Path) -> None:
    """Each worker writes its own shard file, and the lifecycle state of both (the clock, the admission
    sketches summed) goes beside them; one device restores them and continues exactly as from a
    checkpoint of 2 in-process replicas."""
    case = WORKER_CASES[-1]
    tables = workers / "ckpt" / "tables"
    assert sorted(p.name for p in tables.iterdir()) == ["0.lifecycle.npz", "0.worker0.npz", "0.worker1.npz"]
    _train(strategy_of, 2, case, save=str(tmp_path / "ckpt"))
    theirs, ours = np.load(tables / "0.lifecycle.npz"), np.load(tmp_path / "ckpt" / "tables" / "0.lifecycle.npz")
    assert theirs["sketch"].sum() > 0 and int(theirs["clock"]) == int(ours["clock"]) == STEPS
    np.testing.assert_array_equal(theirs["sketch"], ours["sketch"])
    from_workers = _by_key(_train(strategy_of, 1, case, restore=str(workers / "ckpt")))
    _assert_same(from_workers, _by_key(_train(strategy_of, 1, case, restore=str(tmp_path / "ckpt"))))


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


@pytest.mark.slow
@pytest.mark.multiprocess
def test_launcher_stops_all_when_a_worker_dies() -> None:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sok_tutorial.launch", "--workers", "2", *MODULE[1:],
                           "--steps", "40", "--die-at-step", "2"], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and time.monotonic() - start < 90
    assert "worker 1 exit code 17" in done.stderr, done.stderr[-2000:]
    assert "[rank 1] worker 1: exiting at step 2" in done.stdout


@pytest.mark.slow
@pytest.mark.multiprocess
def test_survivor_exits_with_clear_error_without_launcher() -> None:
    """Started by hand (no launcher to stop it), the surviving worker fails fast and says why."""
    procs = [subprocess.Popen([*MODULE, "--steps", "40", "--die-at-step", "2", "--timeout", "15"],
                              env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for env in worker_environments(2)]
    (code_0, text_0), (code_1, _) = _wait(procs, 90)
    assert code_1 == 17
    assert code_0 != 0 and "a peer stopped answering" in text_0, text_0[-2000:]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_unreachable_worker_is_a_clear_error() -> None:
    env = worker_environments(2)[0]  # worker 1 is never started
    start = time.monotonic()
    done = subprocess.run([*MODULE, "--timeout", "3"], env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
                          capture_output=True, text=True, timeout=90)
    assert done.returncode != 0 and time.monotonic() - start < 60
    assert "worker 1 at localhost:" in done.stderr and "unreachable" in done.stderr, done.stderr[-2000:]
