"""Progress bars for long work, silenced with ``progress=False``."""
from __future__ import annotations

import sys
from typing import Any


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress_bar(enabled: bool, *, total: int | None = None, desc: str = "", unit: str = "it",
                 unit_scale: bool = True) -> Any:
    """A text tqdm bar on stderr (readable in terminals, notebooks and papermill logs), or a no-op."""
    if not enabled:
        return _Silent()
    from tqdm.std import tqdm

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=sys.stderr,
                mininterval=0.5, dynamic_ncols=False, ncols=100)
