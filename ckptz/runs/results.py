"""What the library returns and how it reports progress: :class:`Summary`, :class:`Reporter`.

Plain data, no behaviour beyond derived totals; :mod:`ckptz.api` re-exports all of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ckptz.accounting import ComponentStats, FileStats, merge_counts
from ckptz.runs.plan import Action


class Reporter(Protocol):
    """Receives progress while a long operation runs (the CLI draws a Rich progress bar).

    ``advance`` and the ``file`` calls come from worker threads.
    """

    def start(self, total: int, description: str) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def file(self, relpath: str) -> None: ...

    def file_done(self, relpath: str) -> None: ...

    def notice(self, text: str) -> None: ...


class SilentReporter:
    """A :class:`Reporter` that ignores everything (the default)."""

    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file(self, relpath: str) -> None:
        pass

    def file_done(self, relpath: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Summary:
    """The result of compress, decompress or inspect.

    Attributes:
        operation: ``compress``, ``decompress`` or ``inspect``.
        root: the source the operation was given (several are joined by ", ").
        files: one entry per checkpoint file or container (with ``dry_run``, estimates).
        components: per-component totals over ``files``.
        copied: other files copied unchanged (relative paths).
        device: where the codec ran (None for inspect).
        threads: CPU threads used.
        seconds: wall time.
        notices: things the user should know (e.g. fell back to the CPU).
        actions: what was done to each input, skips included, or with ``dry_run`` what
            would be.
        dry_run: nothing was written; ``files`` hold estimates from a sample.
        ranks: under ``torchrun``, the rank that did each of ``files``; empty in one process.
    """

    operation: str
    root: str
    files: tuple[FileStats, ...]
    components: tuple[ComponentStats, ...]
    copied: tuple[str, ...] = ()
    device: str | None = None
    threads: int | None = None
    seconds: float = 0.0
    notices: tuple[str, ...] = ()
    actions: tuple[Action, ...] = ()
    dry_run: bool = False
    ranks: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def compressed_bytes(self) -> int | None:
        read = [f for f in self.files if f.error is None]  # a damaged container has no sizes to add
        if not read or any(f.compressed_bytes is None for f in read):
            return None
        return sum(f.compressed_bytes or 0 for f in read)

    @property
    def overhead_bytes(self) -> int:
        """Bytes of the containers' own structure (header, index, footer, alignment)."""
        return sum(f.overhead_bytes for f in self.files)

    @property
    def ratio(self) -> float | None:
        packed = self.compressed_bytes
        return None if not packed else self.bytes / packed

    @property
    def codecs(self) -> dict[str, int]:
        return merge_counts(f.codecs for f in self.files)
