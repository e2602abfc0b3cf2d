"""The command line's progress display: a :class:`ckptz.api.Reporter` drawing on stderr.

Part of the CLI layer (with ``cli.py`` and ``report.py``, the only modules that import Rich).
On a terminal it draws a Rich progress bar naming the files in flight; elsewhere (CI logs,
``2> file``) it prints a plain line every ``$CKPTZ_PROGRESS_SECONDS`` seconds (default 10),
so logs show movement without control characters. Notices are printed once each.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, cast

from rich.console import Console
from rich.filesize import decimal

from ckptz import settings

if TYPE_CHECKING:  # the bar's modules load only where one is drawn (a terminal)
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID
    from rich.table import Column

#: How many in-flight names the bar shows before "+N".
SHOWN_FILES = 2


def _kept() -> Column:
    """A progress column whose text stays on one line, whole."""
    from rich.table import Column

    return Column(no_wrap=True)


def _interval() -> float:
    return max(0.0, float(cast(float, settings.value("progress_seconds"))))


class Progress:
    """Progress, notices and (with ``verbose``) finished files, on ``console`` (stderr).

    Args:
        console: where to draw.
        show: draw progress at all (off with ``--quiet`` or ``--no-progress``).
        quiet: also drop notices.
        verbose: print a line per finished file.
    """

    def __init__(self, console: Console, *, show: bool, quiet: bool, verbose: bool) -> None:
        self.console = console
        self.show = show
        self.quiet = quiet
        self.verbose = verbose
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._flight: list[str] = []
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._total = self._done = 0
        self._what = ""
        self._began = self._last = time.monotonic()
        self._every = _interval()

    # Reporter -------------------------------------------------------------------------

    def start(self, total: int, description: str) -> None:
        with self._lock:
            self._total, self._done, self._what = total, 0, description
            self._began = self._last = time.monotonic()
            if not self.show:
                return
            if self.console.is_terminal:
                if self._bar is None:
                    from rich.progress import (
                        BarColumn,
                        DownloadColumn,
                        TextColumn,
                        TimeRemainingColumn,
                        TransferSpeedColumn,
                    )
                    from rich.progress import Progress as RichProgress
                    from rich.table import Column

                    # A narrow terminal shortens the bar and the names in flight, never a figure.
                    bar = 24 if self.console.width >= 100 else 12
                    names = max(12, self.console.width - bar - 46)
                    self._bar = RichProgress(
                        # Figures never wrap (a narrow terminal split "12.3/45.6 MB" over two lines).
                        TextColumn("{task.description}", style="bold", markup=False, table_column=_kept()),
                        BarColumn(bar_width=bar),
                        DownloadColumn(binary_units=False, table_column=_kept()),
                        TransferSpeedColumn(table_column=_kept()),
                        TimeRemainingColumn(table_column=_kept()),
                        TextColumn(
                            "{task.fields[files]}",
                            style="dim",
                            markup=False,
                            table_column=Column(no_wrap=True, overflow="ellipsis", max_width=names),
                        ),
                        console=self.console,
                        transient=True,
                    )
                    self._bar.start()
                self._task = self._bar.add_task(description, total=total, files="")

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self._done += nbytes
            if self._bar is not None and self._task is not None:
                self._bar.advance(self._task, nbytes)
            else:
                self._maybe_line()

    def file(self, relpath: str) -> None:
        with self._lock:
            self._flight.append(relpath)
            self._refresh_files()

    def file_done(self, relpath: str) -> None:
        with self._lock:
            if relpath in self._flight:
                self._flight.remove(relpath)
            self._refresh_files()
            if self.verbose and not self.quiet:
                self._print(f"ckptz: done: {relpath}")

    def notice(self, text: str) -> None:
        with self._lock:
            if self.quiet or text in self._seen:
                return
            self._seen.add(text)
            self._print(f"ckptz: {text}")

    # Drawing --------------------------------------------------------------------------

    def in_flight(self) -> str:
        """The files being worked on, as the bar shows them."""
        names = self._flight[:SHOWN_FILES]
        more = len(self._flight) - len(names)
        return ", ".join(names) + (f" +{more}" if more > 0 else "")

    def _refresh_files(self) -> None:
        if self._bar is not None and self._task is not None:
            # Drawn at once: files start and end less often than the bar's refresh, and a
            # short run would otherwise never show them.
            self._bar.update(self._task, files=self.in_flight(), refresh=True)

    def _maybe_line(self) -> None:
        if not self.show or self._bar is not None:
            return
        now = time.monotonic()
        if now - self._last < self._every:
            return
        self._last = now
        share = f"{100 * self._done / self._total:.0f}%" if self._total else "-"
        speed = self._done / max(now - self._began, 1e-9)
        line = f"ckptz: {self._what} {share} ({decimal(self._done)} of {decimal(self._total)}, {decimal(int(speed))}/s)"
        if self._flight:
            line += f"; in flight: {self.in_flight()}"
        self._print(line)

    def _print(self, line: str) -> None:
        target = self._bar.console if self._bar is not None else self.console
        target.print(line, soft_wrap=True)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None
                self._task = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
