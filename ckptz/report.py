"""Rendering results: Rich tables for people, plain dicts for ``--json``.

Renderables are data in, layout out; nothing here computes a statistic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Group, RenderableType
from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from ckptz.accounting import ComponentStats, FileStats
from ckptz.api import Summary, VerifyResult

if TYPE_CHECKING:
    from ckptz.bench.benchmark import BenchResult

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
    table.add_column("tensors", justify="right", no_wrap=True)
    table.add_column("original", justify="right", no_wrap=True)
    if compressed:
        table.add_column("compressed", justify="right", no_wrap=True)
        table.add_column("ratio", justify="right", no_wrap=True)
        table.add_column("saved", justify="right", no_wrap=True)
        table.add_column("codecs")
    else:
        table.add_column("share", justify="right", no_wrap=True)
        table.add_column("", no_wrap=True)
        table.add_column("dtypes")
    for c in summary.components:
        table.add_row(*_component_cells(c, compressed, total))
        if not compressed and len(c.dtypes) > 1:
            # The audit's question is which bytes dominate: split mixed components by dtype.
            for dtype, nbytes in sorted(c.dtypes.items(), key=lambda kv: -kv[1]):
                share = nbytes / total
                table.add_row(
                    Text(f"  {dtype}", style="dim"),
                    "",
                    decimal(nbytes),
                    f"{100 * share:.1f}%",
                    _bar(share),
                    "",
                )
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
    """Per-file table; a raw checkpoint's files show no compressed columns."""
    packed = any(f.compressed_bytes is not None for f in files)
    table = Table(box=box.SIMPLE, title="files", title_justify="left")
    # The path is the row's key: it takes the room it needs, up to half a wide terminal.
    longest = max((len(f.path) for f in files), default=4)
    table.add_column("file", overflow="fold", min_width=min(longest, 40))
    table.add_column("format", no_wrap=True)
    table.add_column("original", justify="right", no_wrap=True)
    if packed:
        table.add_column("compressed", justify="right", no_wrap=True)
        table.add_column("ratio", justify="right", no_wrap=True)
        table.add_column("device", no_wrap=True)
        table.add_column("decodes", no_wrap=True)
    for f in files:
        row = [f.path, f.format, decimal(f.bytes)]
        if packed:
            known = f.compressed_bytes is not None
            row += [
                decimal(f.compressed_bytes or 0) if known else "-",
                _ratio(f.ratio),
                f.device or "-",
                ("CPU+GPU" if f.portable else "GPU only") if known else "-",
            ]
        table.add_row(*row)
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


def _gbps(x: float) -> str:
    return "∞" if x == float("inf") else f"{x:.3g}"


def _finite(x: float) -> float | None:
    """JSON has no infinity: a ratio or speed too large to measure becomes null."""
    return None if x in (float("inf"), float("-inf")) else x


def bench_view(result: BenchResult) -> RenderableType:
    """The tables of ``ckptz bench``: codecs per component, storage plans, recommendation."""
    table = Table(title=f"bench: {result.root}", box=box.SIMPLE_HEAVY, title_justify="left")
    for name, justify in (
        ("component", "left"),
        ("codec", "left"),
        ("device", "left"),
        ("ratio", "right"),
        ("compress", "right"),
        ("decompress", "right"),
        ("decodes", "left"),
        ("limit", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=name in ("component", "codec"))  # type: ignore[arg-type]
    samples = {s.component: s for s in result.samples}
    for i, comp in enumerate(dict.fromkeys(r.component for r in result.rows)):
        if i:
            table.add_section()
        s = samples[comp]
        sampled = "whole" if s.sampled_frames == s.frames else f"{decimal(s.sample_bytes)} sampled"
        for j, r in enumerate(r for r in result.rows if r.component == comp):
            first = j == 0
            table.add_row(
                Text(comp, style="bold") if first else "",
                r.codec,
                r.device,
                _ratio(r.ratio),
                _gbps(r.compress_gbps),
                _gbps(r.decompress_gbps),
                "CPU+GPU" if r.portable else "GPU only",
                f"{_gbps(r.bound_ratio)} / {_gbps(r.chunk_bound_ratio)}" if first else "",
            )
        table.add_row(Text(f"  {decimal(s.bytes)}, {sampled}", style="dim"), *[""] * 7)
    notes = [
        Text(
            "speeds in GB/s of original bytes; limit: order-0 entropy bound (as a ratio) of the byte planes, "
            "one histogram per plane / one per 256 KiB of each plane; "
            f"speeds: median of {result.repeats} after a verified warm-up, "
            f"{result.threads} CPU threads, data in host memory",
            style="dim",
        )
    ]
    notes += [Text(f"skipped {name}: {why}", style="dim") for name, why in result.skipped]
    return Group(table, *notes, _plans_table(result), _recommendation(result))


def _plans_table(result: BenchResult) -> Table:
    st, cost = result.storage, result.cost
    title = (
        f"checkpoint of {decimal(result.bytes)} on storage writing {st.write_gbps:.3g} GB/s, "
        f"reading {st.read_gbps:.3g} GB/s ({st.method})"
    )
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    for name in (
        "codec",
        "device",
        "ratio",
        "write s",
        "restore s",
        "saved s",
        "GPU-h/mo",
        "$ GPUs/mo",
        "$ storage/mo",
    ):
        table.add_column(name, justify="left" if name in ("codec", "device") else "right")
    rec = result.recommendation
    table.add_row(
        "uncompressed",
        "-",
        "1.000×",
        f"{rec.baseline_write_seconds:.3g}",
        f"{rec.baseline_restore_seconds:.3g}",
        "-",
        "-",
        "-",
        "-",
    )
    for p in result.plans:
        t = p.totals
        table.add_row(
            Text(t.codec, style="bold green" if t.codec == rec.codec else ""),
            t.device,
            _ratio(t.ratio),
            f"{p.write_seconds:.3g}",
            f"{p.restore_seconds:.3g}",
            f"{p.stall_saved_seconds:+.3g}",
            f"{p.idle_gpu_hours_month:+.3g}",
            f"{p.idle_usd_month:+,.2f}",
            f"{p.storage_usd_month:+,.2f}",
        )
    table.caption = (
        f"projection: {cost.gpus} GPUs idle during each save at ${cost.gpu_hour_usd:g}/GPU-hour, "
        f"a checkpoint every {cost.every_min:g} min (30-day month), {cost.keep} kept at ${cost.storage_usd_tb_month:g}/TB-month"
    )
    table.caption_justify = "left"
    return table


def _recommendation(result: BenchResult) -> Text:
    rec = result.recommendation
    if rec.pays:
        return Text(f"recommended: {rec.reason}", style="bold green")
    return Text(f"recommended: write uncompressed — {rec.reason}", style="bold yellow")


def bench_json(result: BenchResult) -> dict[str, Any]:
    """The ``--json`` form of a bench result."""
    st, cost, rec = result.storage, result.cost, result.recommendation
    return {
        "root": result.root,
        "files": list(result.files),
        "bytes": result.bytes,
        "threads": result.threads,
        "repeats": result.repeats,
        "seconds": result.seconds,
        "samples": [
            {
                "component": s.component,
                "bytes": s.bytes,
                "sample_bytes": s.sample_bytes,
                "frames": s.frames,
                "sampled_frames": s.sampled_frames,
                "whole": s.frames == s.sampled_frames,
            }
            for s in result.samples
        ],
        "rows": [
            {
                "component": r.component,
                "codec": r.codec,
                "device": r.device,
                "ratio": _finite(r.ratio),
                "compress_gbps": _finite(r.compress_gbps),
                "decompress_gbps": _finite(r.decompress_gbps),
                "portable": r.portable,
                "bound_ratio": _finite(r.bound_ratio),
                "chunk_bound_ratio": _finite(r.chunk_bound_ratio),
                "bytes": r.bytes,
                "compressed_bytes": r.compressed_bytes,
            }
            for r in result.rows
        ],
        "skipped": [{"codec": name, "reason": why} for name, why in result.skipped],
        "storage": {
            "path": st.path,
            "write_gbps": st.write_gbps,
            "read_gbps": st.read_gbps,
            "method": st.method,
        },
        "plans": [
            {
                "codec": p.totals.codec,
                "device": p.totals.device,
                "ckptz": p.totals.ckptz,
                "portable": p.totals.portable,
                "ratio": _finite(p.totals.ratio),
                "compressed_bytes": p.totals.compressed_bytes,
                "write_seconds": p.write_seconds,
                "restore_seconds": p.restore_seconds,
                "stall_saved_seconds": p.stall_saved_seconds,
            }
            for p in result.plans
        ],
        "recommendation": {
            "codec": rec.codec,
            "device": rec.device,
            "pays": rec.pays,
            "baseline_write_seconds": rec.baseline_write_seconds,
            "baseline_restore_seconds": rec.baseline_restore_seconds,
            "reason": rec.reason,
        },
        "projection": {
            "gpus": cost.gpus,
            "gpu_hour_usd": cost.gpu_hour_usd,
            "every_min": cost.every_min,
            "storage_usd_tb_month": cost.storage_usd_tb_month,
            "keep": cost.keep,
            "checkpoints_per_month": cost.checkpoints_per_month,
            "codecs": [
                {
                    "codec": p.totals.codec,
                    "device": p.totals.device,
                    "idle_gpu_hours_month": p.idle_gpu_hours_month,
                    "idle_usd_month": p.idle_usd_month,
                    "storage_tb_saved": p.storage_tb_saved,
                    "storage_usd_month": p.storage_usd_month,
                }
                for p in result.plans
            ],
        },
    }
