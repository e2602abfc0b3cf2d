"""Rendering results: Rich tables for people, plain dicts for ``--json``.

Renderables are data in, layout out; nothing here computes a statistic.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from ckptz.accounting import ComponentStats, FileStats
from ckptz.api import Summary, VerifyResult

BAR_WIDTH = 20


def _ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return "∞" if r == float("inf") else f"{r:.3f}×"


def _saved(original: int, packed: int | None) -> str:
    if packed is None or not original:
        return "-"
    return f"{100 * (1 - packed / original):.1f}%"


def _bar(share: float) -> Text:
    full = round(share * BAR_WIDTH)
    return Text("█" * full + "·" * (BAR_WIDTH - full), style="cyan")


def _codecs(codecs: dict[str, int]) -> str:
    total = sum(codecs.values()) or 1
    parts = sorted(codecs.items(), key=lambda kv: -kv[1])
    return " ".join(f"{name} {100 * n / total:.0f}%" for name, n in parts)


def _dtypes(dtypes: dict[str, int]) -> str:
    return ", ".join(name for name, _ in sorted(dtypes.items(), key=lambda kv: -kv[1]))


def components_table(summary: Summary) -> Table:
    """Per-component table: the audit view of a raw checkpoint, or ratios of a compressed one."""
    compressed = summary.compressed_bytes is not None
    total = summary.bytes or 1
    title = "compressed checkpoint" if compressed else "checkpoint"
    if summary.operation != "inspect":
        title = f"{summary.operation}: {summary.root}"
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    # Component names are the table's key: never truncate them on narrow terminals.
    table.add_column(
        "component", no_wrap=True, min_width=max((len(c.name) for c in summary.components), default=5)
    )
    table.add_column("tensors", justify="right")
    table.add_column("original", justify="right")
    if compressed:
        table.add_column("compressed", justify="right")
        table.add_column("ratio", justify="right")
        table.add_column("saved", justify="right")
        table.add_column("codecs")
    else:
        table.add_column("share", justify="right")
        table.add_column("", no_wrap=True)
        table.add_column("dtypes")
    for c in summary.components:
        table.add_row(*_component_cells(c, compressed, total))
    table.add_section()
    totals: list[RenderableType] = [
        Text("total", style="bold"),
        str(sum(c.tensors for c in summary.components)),
        decimal(summary.bytes),
    ]
    if compressed:
        totals += [
            decimal(summary.compressed_bytes or 0),
            _ratio(summary.ratio),
            _saved(summary.bytes, summary.compressed_bytes),
            _codecs(summary.codecs),
        ]
    else:
        totals += ["100%", "", ""]
    table.add_row(*totals)
    return table


def _component_cells(c: ComponentStats, compressed: bool, total: int) -> list[RenderableType]:
    cells: list[RenderableType] = [c.name, str(c.tensors), decimal(c.bytes)]
    if compressed:
        cells += [
            decimal(c.compressed_bytes or 0),
            _ratio(c.ratio),
            _saved(c.bytes, c.compressed_bytes),
            _codecs(c.codecs),
        ]
    else:
        share = c.bytes / total
        cells += [f"{100 * share:.1f}%", _bar(share), _dtypes(c.dtypes)]
    return cells


def files_table(files: tuple[FileStats, ...]) -> Table:
    """Per-file table."""
    table = Table(box=box.SIMPLE, title="files", title_justify="left")
    table.add_column("file", overflow="fold")
    table.add_column("format")
    table.add_column("original", justify="right")
    table.add_column("compressed", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("written on")
    table.add_column("decodes on")
    for f in files:
        packed = f.compressed_bytes is not None
        table.add_row(
            f.path,
            f.format,
            decimal(f.bytes),
            decimal(f.compressed_bytes or 0) if packed else "-",
            _ratio(f.ratio),
            f.device or "-",
            ("CPU and GPU" if f.portable else "GPU only") if packed else "-",
        )
    return table


def summary_view(summary: Summary) -> RenderableType:
    """Everything a command shows for a summary."""
    parts: list[RenderableType] = [components_table(summary)]
    if len(summary.files) > 1 or summary.operation == "inspect":
        parts.append(files_table(summary.files))
    if summary.operation != "inspect":
        speed = summary.bytes / summary.seconds / 1e9 if summary.seconds else 0.0
        line = f"{len(summary.files)} files on {summary.device} ({summary.threads} threads) in {summary.seconds:.2f} s"
        line += f", {speed:.2f} GB/s"
        if summary.copied:
            line += f"; {len(summary.copied)} other files copied unchanged"
        parts.append(Text(line, style="dim"))
    return Group(*parts)


def verify_view(result: VerifyResult) -> RenderableType:
    """Per-file verdicts of verify."""
    table = Table(box=box.SIMPLE, title=f"verify: {result.root}", title_justify="left")
    table.add_column("file")
    table.add_column("bytes", justify="right")
    table.add_column("result")
    for f in result.files:
        verdict = Text("ok", style="green") if f.ok else Text(f.error or "failed", style="red")
        table.add_row(f.path, decimal(f.bytes) if f.ok else "-", verdict)
    what = "byte-identical to " + result.against if result.against else "all checksums and digests match"
    footer = Text(
        f"{what}"
        if result.ok
        else f"{sum(not f.ok for f in result.files)} of {len(result.files)} files failed",
        style="bold green" if result.ok else "bold red",
    )
    return Group(table, footer)


def component_json(c: ComponentStats, total: int) -> dict[str, Any]:
    return {
        "name": c.name,
        "tensors": c.tensors,
        "bytes": c.bytes,
        "compressed_bytes": c.compressed_bytes,
        "ratio": c.ratio,
        "share": c.bytes / total if total else 0.0,
        "dtypes": c.dtypes,
        "codecs": c.codecs,
    }


def summary_json(summary: Summary) -> dict[str, Any]:
    """The ``--json`` form of a summary."""
    return {
        "operation": summary.operation,
        "root": summary.root,
        "bytes": summary.bytes,
        "compressed_bytes": summary.compressed_bytes,
        "ratio": summary.ratio,
        "device": summary.device,
        "threads": summary.threads,
        "seconds": summary.seconds,
        "notices": list(summary.notices),
        "components": [component_json(c, summary.bytes) for c in summary.components],
        "files": [
            {
                "path": f.path,
                "format": f.format,
                "bytes": f.bytes,
                "compressed_bytes": f.compressed_bytes,
                "ratio": f.ratio,
                "device": f.device,
                "portable": f.portable,
                "codecs": f.codecs,
                "components": [component_json(c, f.bytes) for c in f.components],
            }
            for f in summary.files
        ],
        "copied": list(summary.copied),
    }


def verify_json(result: VerifyResult) -> dict[str, Any]:
    """The ``--json`` form of a verify result."""
    return {
        "ok": result.ok,
        "root": result.root,
        "against": result.against,
        "device": result.device,
        "seconds": result.seconds,
        "files": [{"path": f.path, "ok": f.ok, "bytes": f.bytes, "error": f.error} for f in result.files],
    }
