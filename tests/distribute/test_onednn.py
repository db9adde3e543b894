"""TensorFlow's oneDNN kernels chosen before it loads (`sok_tutorial.onednn`): ``import sok_tutorial``
leaves TensorFlow unloaded, the choice reaches it, bad input changes nothing, and once TensorFlow
is loaded the other choice is refused."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# In a fresh process: TensorFlow is not loaded yet when `use_onednn` runs.
PROBE = textwrap.dedent("""
    import json, os, sys
    import sok_tutorial as sok
    out = {"tf_loaded_by_import": "tensorflow" in sys.modules}
    try:
        sok.use_onednn("yes")
    except ValueError as exc:
        out["bad_input"] = str(exc)
    out["env_after_bad_input"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    sok.use_onednn(CHOICE)
    import tensorflow as tf
    out["enabled"] = sok.onednn_enabled()
    sok.use_onednn(CHOICE)  # what it has: nothing to do
    out["env_before_refusal"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")  # as use_onednn set it
    try:
        sok.use_onednn(not CHOICE)
    except RuntimeError as exc:
        out["refused"] = str(exc)
    out["env_after_refusal"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    print("RESULT " + json.dumps(out))
""")


def probe(enable: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    out = subprocess.run([sys.executable, "-c", PROBE.replace("CHOICE", str(enable))], capture_output=True, text=True,
                         cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, timeout=300)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and line, out.stderr[-3000:]
    return json.loads(line[0][7:])


@pytest.mark.parametrize("enable", [True, False])
def test_the_choice_reaches_tensorflow_and_the_other_is_refused_once_it_is_loaded(enable):
    got = probe(enable)
    assert not got["tf_loaded_by_import"]
    assert "enable='yes'" in got["bad_input"] and got["env_after_bad_input"] is None
    if enable and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("oneDNN's switch is checked on x86 wheels")
    assert got["enabled"] is enable
    assert f"already imported with oneDNN {'on' if enable else 'off'}" in got["refused"]
    assert got["env_before_refusal"] == got["env_after_refusal"] == ("1" if enable else "0")
