"""A step's freed temporaries stay in the process (`sok_tutorial.embedding.heap_reuse`): a large
block freed and allocated again costs no page faults once the settings are made, and does
without them; a table makes them; the environment switch turns them off."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sok_tutorial.embedding import heap_reuse

ROOT = Path(__file__).resolve().parents[2]
BLOCK, BLOCKS = 12 << 20, 6  # a step's temporaries: six of 12 MiB, live at once
ROUNDS = 4
PAGES = ROUNDS * BLOCKS * BLOCK // 4096  # the pages the rounds touch
FRESH = ROUNDS * BLOCK // 4096  # more faults than this: more than a block's pages came fresh each round

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")

# Run in a fresh process: the settings are the process's for good. It makes them (or not) the way
# `setup` says, then, ROUNDS times after a first round, allocates and fills six 12 MiB blocks and
# frees them on a thread of its own (`thread`; else on the main thread), as an op's thread does a
# step's temporaries, and prints what the settings call returned and the page faults of those
# rounds. (glibc's own dynamic threshold keeps one freed block of this size; six at once exceed the
# trim threshold it sets beside it and one 64 MiB heap of the thread's arena, and without the
# settings go back to the kernel.)
_PROBE = textwrap.dedent("""
    import ctypes, json, resource, sys, threading
    sys.path.insert(0, {root!r})
    {setup}
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def once():
        blocks = [libc.malloc({block}) for _ in range({blocks})]
        for block in blocks:
            ctypes.memset(block, 1, {block})
        for block in blocks:
            libc.free(block)

    def rounds(count):
        for _ in range(count):
            once()

    def on_a_thread(count):
        thread = threading.Thread(target=rounds, args=(count,))
        thread.start()
        thread.join()

    run = on_a_thread if {thread} else rounds
    run(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    run({rounds})
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print("PROBE " + json.dumps({{"set": set_, "faults": faults}}))
""")

_ALONE = """
import importlib.util
spec = importlib.util.spec_from_file_location("heap_reuse", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
set_ = module.keep_freed_memory() if {call} else None
"""

_TABLE = """
import tensorflow as tf
from sok_tutorial.embedding import EmbeddingTable, heap_reuse
table = EmbeddingTable(16, 4, name="t")
table.lookup(tf.constant([1, 2]))
set_ = bool(heap_reuse._done and heap_reuse._done[0])
"""


def probe(setup: str, switch: str | None = None, thread: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SOK_TUTORIAL_HEAP_REUSE"}
    if switch is not None:
        env["SOK_TUTORIAL_HEAP_REUSE"] = switch
    code = _PROBE.format(root=str(ROOT), setup=setup.strip(), block=BLOCK, blocks=BLOCKS, rounds=ROUNDS,
                         thread=thread)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("PROBE ")]
    assert out.returncode == 0 and line, out.stderr[-2000:]
    return json.loads(line[0][6:])


def alone(call: bool) -> str:
    return _ALONE.format(path=str(ROOT / "sok_tutorial" / "embedding" / "heap_reuse.py"), call=call)


def test_a_freed_block_is_taken_again_without_page_faults():
    as_glibc_has_it = probe(alone(call=False))
    assert as_glibc_has_it["faults"] > FRESH  # blocks are fresh memory each round
    kept = probe(alone(call=True))
    assert kept["set"] is True
    assert kept["faults"] < PAGES // 100


def test_the_environment_switch_turns_it_off():
    off = probe(alone(call=True), switch="0")
    assert off["set"] is False
    assert off["faults"] > FRESH


def test_a_table_makes_the_settings_when_first_looked_up():
    # (on the main thread: in a process where TensorFlow has made its threads, a new thread shares one
    # of their arenas, whose heaps are laid out as their allocations left them)
    made = probe(_TABLE, thread=False)
    assert made["set"] is True
    assert made["faults"] < PAGES // 100


def test_later_calls_return_the_first_outcome():
    first = heap_reuse.keep_freed_memory()
    assert heap_reuse.keep_freed_memory() is first
    assert heap_reuse._done == [first]
