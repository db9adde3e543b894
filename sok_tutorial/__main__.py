"""``python -m sok_tutorial info``: versions, visible devices and usable GPU libraries."""
from __future__ import annotations

import argparse
import os
import platform
import sys


def info() -> dict[str, str]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # no CUDA-init error line on a CPU machine
    import keras
    import tensorflow as tf

    import sok_tutorial
    from kernels import backend

    devices = tf.config.list_physical_devices()
    rows = {
        "sok_tutorial": sok_tutorial.__version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "tensorflow": f"{tf.__version__} (built with CUDA: {tf.test.is_built_with_cuda()})",
        "keras": f"{keras.__version__} (backend: {keras.backend.backend()})",
        "tf devices": ", ".join(f"{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in devices),
        "cpu cores": str(os.cpu_count()),
    }
    rows.update(backend.info())
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sok_tutorial", description=__doc__)
    parser.add_argument("command", choices=["info"])
    parser.parse_args(argv)
    rows = info()
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
