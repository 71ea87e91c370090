"""One progress reporter for every long command (``reproduce``, ``check``, ``figures``, ``llm eval``,
Stage 1 / Stage 2).

On a terminal it is a tqdm bar with rate and ETA on stderr. Elsewhere (CI logs, a file, a pipe) a bar
redraws into unreadable noise, so it writes one line at most every ``interval`` seconds instead
(``label: 12/40 (30%) 1m05s elapsed, ETA 2m31s``) plus a last line at the end. The mode can be forced
with ``TILTLAB_PROGRESS=bar|lines|off`` (``off`` prints nothing); ``TILTLAB_PROGRESS_INTERVAL`` sets
the seconds between lines (default 30).

Usage::

    with progress(total=len(items), desc="figures", unit="figure") as bar:
        for item in items:
            ...
            bar.update(1, postfix=item.name)

    for x in track(items, desc="checks"):  # the same, for a plain loop
        ...
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

__all__ = ["Progress", "format_seconds", "progress", "progress_mode", "track"]

T = TypeVar("T")

_MODES = ("bar", "lines", "off")


def progress_mode(stream: IO[str] | None = None) -> str:
    """``bar`` on a TTY, ``lines`` elsewhere; ``TILTLAB_PROGRESS`` overrides (``bar``/``lines``/``off``)."""
    env = os.environ.get("TILTLAB_PROGRESS", "").strip().lower()
    if env:
        if env not in _MODES:
            raise ValueError(f"TILTLAB_PROGRESS must be one of {', '.join(_MODES)}, got {env!r}")
        return env
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return "bar" if callable(isatty) and isatty() else "lines"


def format_seconds(s: float) -> str:
    """``75.2`` -> ``1m15s``; ``3725`` -> ``1h02m05s``; under a minute ``12s``."""
    s = max(0, round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


class Progress:
    """A progress reporter; use :func:`progress` to make one. ``update(n, postfix=...)`` advances it."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        *,
        mode: str | None = None,
        stream: IO[str] | None = None,
        interval: float | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        if total is not None and total < 0:
            raise ValueError(f"total must be >= 0 or None, got {total}")
        self.total, self.desc, self.unit = total, desc, unit
        self.stream = sys.stderr if stream is None else stream
        self.mode = progress_mode(self.stream) if mode is None else mode
        if self.mode not in _MODES:
            raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {self.mode!r}")
        if interval is None:
            raw = os.environ.get("TILTLAB_PROGRESS_INTERVAL", "30")
            try:
                interval = float(raw)
            except ValueError:
                raise ValueError(f"TILTLAB_PROGRESS_INTERVAL must be a number of seconds, got {raw!r}") from None
        if interval < 0:
            raise ValueError(f"progress interval must be >= 0 seconds, got {interval}")
        self.interval = interval
        self.clock = clock
        self.n = 0
        self.postfix = ""
        self._t0 = clock()
        self._last_line = self._t0
        self._closed = False
        self._bar: Any = None
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True)

    # -- reporting -------------------------------------------------------------------------------
    def line(self) -> str:
        """The one-line status (what ``lines`` mode writes)."""
        elapsed = self.clock() - self._t0
        if self.total:
            pct = 100.0 * self.n / self.total
            head = f"{self.desc}: {self.n}/{self.total} {self.unit} ({pct:.0f}%) {format_seconds(elapsed)} elapsed"
            if 0 < self.n < self.total:
                eta = elapsed / self.n * (self.total - self.n)
                head += f", ETA {format_seconds(eta)}"
        else:
            head = f"{self.desc}: {self.n} {self.unit} {format_seconds(elapsed)} elapsed"
        return head + (f" [{self.postfix}]" if self.postfix else "")

    def update(self, n: int = 1, postfix: str | None = None) -> None:
        """Advance by ``n`` (and show ``postfix``, e.g. the item just finished)."""
        if n < 0:
            raise ValueError(f"progress can only advance, got n={n}")
        self.n += n
        if postfix is not None:
            self.postfix = str(postfix)
        if self.mode == "bar":
            if postfix is not None:
                self._bar.set_postfix_str(self.postfix, refresh=False)
            self._bar.update(n)
        elif self.mode == "lines":
            now = self.clock()
            if now - self._last_line >= self.interval and not (self.total and self.n >= self.total):
                self._last_line = now
                self._write(self.line())

    def write(self, msg: str) -> None:
        """Print a message without breaking the bar."""
        if self.mode == "bar":
            self._bar.write(msg, file=self.stream)
        elif self.mode == "lines":
            self._write(msg)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.mode == "bar":
            self._bar.close()
        elif self.mode == "lines" and self.n:
            self._write(self.line())

    def _write(self, msg: str) -> None:
        print(msg, file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(total: int | None, desc: str, unit: str = "it", **kw: Any) -> Progress:
    """A :class:`Progress` (a context manager); see the module docstring."""
    return Progress(total, desc, unit, **kw)


def track(items: Iterable[T], desc: str, unit: str = "it", total: int | None = None, **kw: Any) -> Iterator[T]:
    """Iterate ``items`` while reporting progress (one step per item)."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total, desc, unit, **kw) as bar:
        for x in items:
            yield x
            bar.update(1)
