"""`cpu_threads`: TensorFlow's op threads on a CPU, set before TensorFlow starts (which importing
the library does not do).

The test session's TensorFlow has started already, so setting threads runs in a fresh process;
refusals (bad arguments, a GPU under ``"auto"``) are checked here, where nothing may change."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import sok_tutorial as sok
from sok_tutorial import distribute

_SCRIPT = """
import importlib
import json
import pkgutil

import data_gen
import kernels
import sok_tutorial as sok
import tensorflow as tf

for package in (sok, kernels, data_gen):  # importing any module of the library starts no TensorFlow
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(module.name)
out = {"set": sok.cpu_threads(device="cpu")}
out["sum"] = float(tf.reduce_sum(tf.range(10.0)))  # TensorFlow starts with them
out["again"] = sok.cpu_threads(device="CPU")  # the same numbers: nothing to do
try:
    sok.cpu_threads(2, 3, "cpu")
except RuntimeError as exc:
    out["refused"] = str(exc)
t = tf.config.threading
out["now"] = [t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads()]
print("RESULT " + json.dumps(out))
"""


def test_threads_are_set_before_tensorflow_starts_and_kept_after():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    cores = distribute.cpu_cores()
    assert out["set"] == out["again"] == {"intra_op": 1, "inter_op": cores}
    assert out["sum"] == 45.0
    assert "cpu_threads(intra_op=2, inter_op=3): TensorFlow already runs with intra_op=1, " \
           f"inter_op={cores}" in out["refused"] and "before any TensorFlow op" in out["refused"]
    assert out["now"] == [1, cores]  # the refused call changed nothing


def test_cpu_cores_counts_this_process_cores():
    assert 1 <= distribute.cpu_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize(("args", "match"), [
    ({"intra_op": 0}, r"intra_op=0 is invalid: expected a positive integer"),
    ({"intra_op": 1.5}, r"intra_op=1.5 is invalid"),
    ({"inter_op": -2}, r"inter_op=-2 is invalid"),
    ({"inter_op": True}, r"inter_op=True is invalid"),
    ({"device": "tpu"}, r"device='tpu' is invalid: expected one of"),
])
def test_bad_arguments_are_refused_before_anything_is_set(args, match):
    before = (tf.config.threading.get_intra_op_parallelism_threads(),
              tf.config.threading.get_inter_op_parallelism_threads())
    with pytest.raises(ValueError, match=match):
        sok.cpu_threads(**args)
    assert before == (tf.config.threading.get_intra_op_parallelism_threads(),
                      tf.config.threading.get_inter_op_parallelism_threads())


def test_a_model_on_a_gpu_leaves_the_threads_as_they_are(monkeypatch):
    # (on this started TensorFlow, setting other threads would raise)
    assert sok.cpu_threads(device="gpu") is None and sok.cpu_threads(2, 5, "GPU") is None
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"] if kind == "GPU" else [])
    assert sok.cpu_threads() is None and sok.cpu_threads(device="auto") is None
