"""Rendering results: Rich tables for people, plain dicts for ``--json``.

Renderables are data in, layout out; nothing here computes a statistic.
"""

from __future__ import annotations

import math
import posixpath
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.filesize import decimal
from rich.table import Table
from rich.text import Text

from ckptz.accounting import ComponentStats, FileStats
from ckptz.api import Action, Summary, VerifyResult
from ckptz.container import SUFFIX
from ckptz.runs.tree import UNREADABLE

if TYPE_CHECKING:
    from ckptz.bench.benchmark import BenchResult, BenchRow
    from ckptz.bench.series import SeriesBenchResult

BAR_WIDTH = 20
#: Below this many columns, tables switch to their narrow layout.
NARROW = 100


class Fit:
    """Renders ``wide`` where it fits and ``narrow`` on a narrower console (an 80-column terminal)."""

    def __init__(self, wide: RenderableType, narrow: RenderableType, min_width: int = NARROW) -> None:
        self.wide, self.narrow, self.min_width = wide, narrow, min_width

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.wide if options.max_width >= self.min_width else self.narrow


def _ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return "∞" if r == float("inf") else f"{r:.3f}×"


def finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: a ratio or speed that is not a finite number becomes null."""
    return x if x is not None and math.isfinite(x) else None


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


def components_table(summary: Summary, narrow: bool = False) -> Table:
    """Per-component table: the audit view of a raw checkpoint, or ratios of a compressed one.

    The narrow form (for 80 columns) drops the tensor count and the share bar, and puts
    codecs and dtypes on a line of their own under each row.
    """
    compressed = summary.compressed_bytes is not None
    series = compressed and any(f.reference for f in summary.files)
    total = summary.bytes or 1
    title = "compressed checkpoint" if compressed else "checkpoint"
    if summary.operation != "inspect":
        title = f"{summary.operation}: {summary.root}"
    if summary.dry_run:
        how = " (compressed sizes estimated from a sample)" if summary.operation == "compress" else ""
        title = f"{summary.operation} --dry-run: {summary.root}{how}"
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    # Component names are the table's key: never truncate them on narrow terminals.
    table.add_column(
        "component", no_wrap=True, min_width=max((len(c.name) for c in summary.components), default=5)
    )
    if not narrow:
        table.add_column("tensors", justify="right", no_wrap=True)
    table.add_column("original", justify="right", no_wrap=True)
    if compressed:
        table.add_column("compressed", justify="right", no_wrap=True)
        table.add_column("ratio", justify="right", no_wrap=True)
        table.add_column("saved", justify="right", no_wrap=True)
        if series and not narrow:
            table.add_column("delta", justify="right", no_wrap=True)
        if not narrow:
            table.add_column("codecs")
    else:
        table.add_column("share", justify="right", no_wrap=True)
        if not narrow:
            table.add_column("", no_wrap=True)
            table.add_column("dtypes")
    for c in summary.components:
        cells = _component_cells(c, compressed, total, series)
        if narrow:
            detail = cells.pop()
            delta = cells.pop() if series else "-"
            if not compressed:
                cells.pop()  # the bar
            del cells[1]  # tensors
            table.add_row(*cells)
            for line in (detail, f"{delta} as series delta" if delta != "-" else ""):
                if line:
                    table.add_row(Text(f"  {line}", style="dim"), *[""] * (len(cells) - 1))
            continue
        table.add_row(*cells)
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
    if compressed and summary.overhead_bytes:
        # The containers' own index is not any component's: a line of its own.
        row: list[RenderableType] = [Text("container index", style="dim")]
        row += [""] * (not narrow) + ["", decimal(summary.overhead_bytes), "", ""]
        row += [""] * (series and not narrow)
        row += [] if narrow else [Text("header, tables, footer", style="dim")]
        table.add_row(*row)
    table.add_section()
    totals: list[RenderableType] = [Text("total", style="bold")]
    if not narrow:
        totals.append(str(sum(c.tensors for c in summary.components)))
    totals.append(decimal(summary.bytes))
    if compressed:
        totals += [
            decimal(summary.compressed_bytes or 0),
            _ratio(summary.ratio),
            _saved(summary.bytes, summary.compressed_bytes),
        ]
        delta = _share(sum(c.delta_bytes for c in summary.components), summary.bytes)
        totals += [delta] * (series and not narrow)
        totals += [] if narrow else [_codecs(summary.codecs)]
    else:
        totals += ["100%"] + ([] if narrow else ["", ""])
    table.add_row(*totals)
    return table


def _share(part: int, whole: int) -> str:
    """The share of bytes coded as a series delta ("-" for none)."""
    return f"{100 * part / whole:.0f}%" if part and whole else "-"


def _component_cells(
    c: ComponentStats, compressed: bool, total: int, series: bool = False
) -> list[RenderableType]:
    cells: list[RenderableType] = [c.name, str(c.tensors), decimal(c.bytes)]
    if compressed:
        cells += [decimal(c.compressed_bytes or 0), _ratio(c.ratio), _saved(c.bytes, c.compressed_bytes)]
        cells += [_share(c.delta_bytes, c.bytes)] * series
        cells.append(_codecs(c.codecs))
    else:
        share = c.bytes / total
        cells += [f"{100 * share:.1f}%", _bar(share), _dtypes(c.dtypes)]
    return cells


def _against(f: FileStats) -> str:
    """What a series container is coded against, shortly: the reference's path from the
    inspected root, or only its folder (``checkpoint-20/``) when the file name is the same."""
    if f.reference is None:
        return "keyframe" if f.keyframe else "-"
    ref = posixpath.normpath(posixpath.join(posixpath.dirname(f.path), f.reference)).removesuffix(SUFFIX)
    folder, name = posixpath.split(ref)
    return f"{folder}/" if folder and name == posixpath.basename(f.path) else ref


#: Characters of a file's path the narrow per-file table shows.
NARROW_PATH = 32


def short_path(path: str, width: int) -> str:
    """``path`` within ``width`` characters where it can be: as many of its last parts as fit,
    after its first folder where that fits too and ``…`` where parts are left out; the file's
    own name is always whole."""
    parts = path.split("/")
    if len(path) <= width or len(parts) < 2:
        return path
    tail = parts[-1]
    for part in reversed(parts[1:-1]):
        if len(part) + len(tail) + 3 > width:
            break
        tail = f"{part}/{tail}"
    head = f"{parts[0]}/…/" if len(parts[0]) + len(tail) + 3 <= width else "…/"
    return head + tail


def files_table(files: tuple[FileStats, ...], narrow: bool = False) -> Table:
    """Per-file table; a raw checkpoint's files show no compressed columns.

    The narrow form leaves out where each container was written and whether it decodes
    without a GPU unless some file does not (then ``decodes`` stays), and the format (the
    name's suffix tells it); long paths lose middle folders, never part of a name.
    """
    packed = any(f.compressed_bytes is not None for f in files)
    table = Table(box=box.SIMPLE, title="files", title_justify="left")
    # The path is the row's key: it takes the room it needs, up to half a wide terminal.
    if narrow:
        # Never split a name mid-word: long paths lose middle folders instead (--json has them whole).
        shown = [short_path(f.path, NARROW_PATH) for f in files]
        table.add_column("file", no_wrap=True, min_width=min(max(map(len, shown), default=4), NARROW_PATH))
    else:
        shown = [f.path for f in files]
        longest = max((len(p) for p in shown), default=4)
        table.add_column("file", overflow="fold", min_width=min(longest, 40))
    series = any(f.reference or f.keyframe for f in files)
    # Narrow, the file's name (its suffix) stands for its format, and gives the room to the name.
    formats = not narrow
    if formats:
        table.add_column("format", no_wrap=True)
    table.add_column("original", justify="right", no_wrap=True)
    gpu_only = any(not f.portable for f in files)
    if packed:
        table.add_column("compressed", justify="right", no_wrap=True)
        table.add_column("ratio", justify="right", no_wrap=True)
        if not narrow:
            table.add_column("device", no_wrap=True)
        if not narrow or gpu_only:
            table.add_column("decodes", no_wrap=True)
        if series:
            table.add_column("against" if narrow else "coded against", overflow="fold")
    for f, path in zip(files, shown, strict=True):
        row = [path, *[f.format] * formats, f.format if f.error is not None else decimal(f.bytes)]
        if packed:
            known = f.compressed_bytes is not None
            row += [decimal(f.compressed_bytes or 0) if known else "-", _ratio(f.ratio)]
            if not narrow:
                row.append(f.device or "-")
            if not narrow or gpu_only:
                row.append(("CPU+GPU" if f.portable else "GPU only") if known else "-")
            if series:
                row.append(_against(f))
        table.add_row(*row)
    return table


#: Files a compress or decompress lists by default; more give way to one line (``-v``: all).
FILES_LISTED = 20


def unreadable_checkpoints(files: tuple[FileStats, ...]) -> list[str]:
    """A warning for each file named like a checkpoint that ckptz could not read (a truncated
    ``.pt``, say): it is stored as opaque bytes, so it restores exactly but saves little."""
    from ckptz.formats import CHECKPOINT_SUFFIXES

    return [
        f"warning: {f.path} is not a readable checkpoint; stored as opaque bytes"
        for f in files
        if f.format == "opaque" and f.path.lower().endswith(CHECKPOINT_SUFFIXES)
    ]


def summary_view(summary: Summary, verbose: bool = False) -> RenderableType:
    """Everything a command shows for a summary (``verbose``: every file, however many)."""
    if not summary.files:
        what = (
            "no checkpoint files or containers"
            if summary.operation == "inspect"
            else "nothing to " + summary.operation
        )
        if summary.copied:
            what += f"; {len(summary.copied)} other files " + (
                "copied unchanged" if summary.operation != "inspect" else ""
            )
        return Text(f"{what.rstrip()} ({summary.root})", style="dim")
    parts: list[RenderableType] = [Fit(components_table(summary), components_table(summary, narrow=True))]
    many = len(summary.files) > FILES_LISTED and not verbose and summary.operation != "inspect"
    if many:
        parts.append(Text(f"{len(summary.files)} files (-v lists each)", style="dim"))
    elif len(summary.files) > 1 or summary.operation == "inspect":
        parts.append(Fit(files_table(summary.files), files_table(summary.files, narrow=True)))
    if summary.operation == "inspect":
        parts += [Text(line, style="yellow") for line in unreadable_checkpoints(summary.files)]
    if summary.dry_run:
        parts.append(Text(_plan_line(summary.actions), style="dim"))
    elif summary.operation != "inspect":
        speed = summary.bytes / summary.seconds / 1e9 if summary.seconds else 0.0
        n = len(summary.files)
        line = f"{n} file{'s' * (n != 1)} on {summary.device} ({summary.threads} thread{'s' * (summary.threads != 1)}) in {summary.seconds:.2f} s"
        if summary.ranks:
            k = len(set(summary.ranks))
            line = line.replace(" (", f" ({k} rank{'s' * (k != 1)}, ", 1)
        line += f", {speed:.2f} GB/s"
        if summary.copied:
            k = len(summary.copied)
            line += f"; {k} other file{'s' * (k != 1)} copied unchanged"
        parts.append(Text(line, style="dim"))
    elif summary.copied:
        k = len(summary.copied)
        parts.append(Text(f"{k} other file{'s' * (k != 1)} (not checkpoints)", style="dim"))
    return Group(*parts)


def _plan_line(actions: tuple[Action, ...]) -> str:
    counts = Counter(a.kind for a in actions)
    parts = [f"{n} to {kind}" if kind != "skip" else f"{n} to skip" for kind, n in counts.items()]
    return (
        "would do: "
        + (", ".join(parts) if parts else "nothing")
        + " (nothing was written; -v lists each file)"
    )


def actions_table(actions: tuple[Action, ...]) -> Table:
    """Every planned or performed action, one per line (``-v``)."""
    table = Table(box=box.SIMPLE, title="files", title_justify="left")
    table.add_column("action", no_wrap=True)
    table.add_column("file", overflow="fold")
    table.add_column("output or note", overflow="fold")
    for a in actions:
        table.add_row(a.kind, a.path, a.note if a.target is None else a.target)
    return table


def notes(actions: tuple[Action, ...], verbose: bool) -> list[str]:
    """One line per skipped file with ``verbose``; else one line per kind of skip, but one
    per file that could not be read (each may hold data the user expected converted)."""
    skips = [a for a in actions if a.kind in ("skip", "remove-stale") or (a.note and a.kind == "copy")]
    unread = [a for a in skips if a.kind == "skip" and a.note and a.note.startswith(UNREADABLE)]
    if verbose:
        return [f"{a.path}: {a.note}" + "; skipped" * (a in unread) for a in skips]
    skips = [a for a in skips if a not in unread]
    by_note = Counter(a.note for a in skips)
    out = [f"{a.path}: {a.note}; skipped" for a in unread]
    for note, n in by_note.items():
        first = next(a.path for a in skips if a.note == note)
        out.append(f"{first}: {note}" if n == 1 else f"{n} files: {note} (e.g. {first}; -v lists them)")
    return out


_STATUS_STYLE = {"ok": "green", "unchecked": "yellow", "skipped": "yellow"}


def verify_view(result: VerifyResult, problems_only: bool = False) -> RenderableType:
    """Per-name verdicts of verify (only the failing ones with ``problems_only``), and a footer."""
    table = Table(box=box.SIMPLE, title=f"verify: {result.root}", title_justify="left")
    table.add_column("file", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("detail", overflow="fold")
    shown = [f for f in result.files if not (problems_only and f.ok)]
    for f in shown:
        style = _STATUS_STYLE.get(f.status, "red")
        detail = f.error or (decimal(f.bytes) if f.bytes else "")
        table.add_row(f.path, Text(f.status, style=style), detail)
    footer = Text(verify_footer(result), style="bold green" if result.ok else "bold red")
    # With only the failures asked for and none: the verdict alone, not an empty table.
    return Group(table, footer) if shown or not problems_only else footer


def verify_footer(result: VerifyResult) -> str:
    counts = result.counts
    unchecked = counts.get("unchecked", 0)
    if result.ok:
        if result.against:
            n = counts.get("ok", 0)
            if n == 1 == len(result.files):
                what = f"the file matches {result.against}: byte-identical"
            else:
                every = "all " if n == len(result.files) else ""
                what = (
                    f"{every}{n} file{'s' * (n != 1)} match{'es' * (n == 1)} {result.against}: byte-identical"
                )
        else:
            ok = counts.get("ok", 0)
            what = (
                f"{ok} containers decode and match their checksums"
                if ok != 1
                else "1 container decodes and matches its checksums"
            )
        if unchecked:
            what += f"; {unchecked} not checked (" + (
                "no --against to compare them)" if not result.against else "not regular files)"
            )
        if counts.get("skipped"):
            what += f"; {counts['skipped']} skipped (cannot be read)"
        return what
    bad = {k: v for k, v in counts.items() if k not in ("ok", "unchecked", "skipped")}
    return f"{sum(bad.values())} of {len(result.files)} failed: " + ", ".join(
        f"{v} {k}" for k, v in sorted(bad.items())
    )


def component_json(c: ComponentStats, total: int) -> dict[str, Any]:
    return {
        "name": c.name,
        "tensors": c.tensors,
        "bytes": c.bytes,
        "compressed_bytes": c.compressed_bytes,
        "ratio": finite(c.ratio),
        "share": c.bytes / total if total else 0.0,
        "dtypes": c.dtypes,
        "codecs": c.codecs,
        "delta_bytes": c.delta_bytes,
    }


def summary_json(summary: Summary) -> dict[str, Any]:
    """The ``--json`` form of a summary (strict JSON: no NaN or infinity)."""
    return {
        "operation": summary.operation,
        "root": summary.root,
        "dry_run": summary.dry_run,
        "bytes": summary.bytes,
        "compressed_bytes": summary.compressed_bytes,
        "overhead_bytes": summary.overhead_bytes,
        "ratio": finite(summary.ratio),
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
                "overhead_bytes": f.overhead_bytes,
                "ratio": finite(f.ratio),
                "device": f.device,
                "portable": f.portable,
                "codecs": f.codecs,
                "reference": f.reference,
                "keyframe": f.keyframe,
                "error": f.error,
                "components": [component_json(c, f.bytes) for c in f.components],
                **({"rank": summary.ranks[i]} if summary.ranks else {}),
            }
            for i, f in enumerate(summary.files)
        ],
        "copied": list(summary.copied),
        "skipped": [{"path": a.path, "reason": a.note} for a in summary.actions if a.kind == "skip"],
        "actions": [
            {"action": a.kind, "path": a.path, "target": a.target, "note": a.note} for a in summary.actions
        ],
    }


def verify_json(result: VerifyResult) -> dict[str, Any]:
    """The ``--json`` form of a verify result: every name with its status."""
    return {
        "ok": result.ok,
        "root": result.root,
        "against": result.against,
        "device": result.device,
        "seconds": result.seconds,
        "counts": result.counts,
        "files": [
            {"path": f.path, "status": f.status, "ok": f.ok, "bytes": f.bytes, "error": f.error}
            for f in result.files
        ],
    }


def _gbps(x: float, sign: str = "") -> str:
    """A speed in GB/s, a ratio or seconds: three significant figures, never in exponent
    form, and "<0.001" below what a table's reader can use (``sign``: ``+`` to sign it)."""
    if x == float("inf"):
        return "∞"
    if 0 < abs(x) < 0.001:
        return f"{'-' if x < 0 else sign}<0.001"
    return _fixed(x, 3, sign)


def _fixed(x: float, figures: int, sign: str = "") -> str:
    """``x`` to ``figures`` significant figures in fixed-point form (``sign``: ``+`` to sign it)."""
    if x == 0 or not math.isfinite(x):
        return f"{x:{sign}.0f}" if x == 0 else str(x)
    decimals = max(0, figures - 1 - math.floor(math.log10(abs(x))))
    return f"{x:{sign},.{decimals}f}"


def _usd(x: float) -> str:
    """A signed amount of dollars: cents, or two significant figures below a cent (a small
    checkpoint's storage costs fractions of one)."""
    return f"{x:+,.2f}" if x == 0 or abs(x) >= 0.01 else _fixed(x, 2, "+")


def bench_view(result: BenchResult) -> RenderableType:
    """The tables of ``ckptz bench``: codecs per component, storage plans, recommendation.

    Below :data:`NARROW` columns, each component becomes a heading line over its codecs,
    and the plans split into a time table and a money table, so nothing is cut.
    """
    notes = [
        Text(
            "speeds in GB/s of original bytes; limit: order-0 entropy bound (as a ratio) of the byte planes, "
            "one histogram per plane / one per 256 KiB of each plane / the same with float exponents "
            "given the exponent before (context); "
            f"speeds: median of {result.repeats} after a verified warm-up, "
            f"{result.threads} CPU threads, data in host memory",
            style="dim",
        )
    ]
    notes += [Text(f"skipped {name}: {why}", style="dim") for name, why in result.skipped]
    return Group(
        Fit(_codecs_table(result), _codecs_tables_narrow(result)),
        *notes,
        Fit(_plans_table(result), Group(_plans_table(result, "time"), _plans_table(result, "money"))),
        _recommendation(result),
    )


def _limit(row: BenchRow) -> str:
    return f"{_gbps(row.bound_ratio)} / {_gbps(row.chunk_bound_ratio)} / {_gbps(row.context_bound_ratio)}"


def _codecs_table(result: BenchResult) -> Table:
    table = Table(title=f"bench: {result.root}", box=box.SIMPLE_HEAVY, title_justify="left")
    columns = [("component", "left"), ("codec", "left"), ("device", "left"), ("ratio", "right")]
    columns += [("compress", "right"), ("decompress", "right"), ("decodes", "left"), ("limit", "right")]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name in ("component", "codec"))  # type: ignore[arg-type]
    for i, (comp, heading, rows) in enumerate(_by_component(result)):
        if i:
            table.add_section()
        for j, r in enumerate(rows):
            limit = _limit(r) if j == 0 else ""
            table.add_row(Text(comp, style="bold") if j == 0 else "", *_codec_cells(r), limit)
        table.add_row(Text(f"  {heading}", style="dim"), *[""] * 7)
    return table


def _codecs_tables_narrow(result: BenchResult) -> Group:
    """One small table per component, its name and sample in the title (80 columns)."""
    tables: list[RenderableType] = [Text(f"bench: {result.root}", style="italic")]
    for comp, heading, rows in _by_component(result):
        limit = f"limit {_limit(rows[0])}"
        table = Table(title=f"{comp}: {heading}; {limit}", box=box.SIMPLE, title_justify="left")
        for name in ("codec", "device", "ratio", "compress", "decompress", "decodes"):
            right = name in ("ratio", "compress", "decompress")
            table.add_column(name, justify="right" if right else "left", no_wrap=True)
        for r in rows:
            table.add_row(*_codec_cells(r))
        tables.append(table)
    return Group(*tables)


def _by_component(result: BenchResult) -> list[tuple[str, str, list[Any]]]:
    samples = {s.component: s for s in result.samples}
    out = []
    for comp in dict.fromkeys(r.component for r in result.rows):
        s = samples[comp]
        sampled = "whole" if s.sampled_frames == s.frames else f"{decimal(s.sample_bytes)} sampled"
        out.append((comp, f"{decimal(s.bytes)}, {sampled}", [r for r in result.rows if r.component == comp]))
    return out


def _codec_cells(r: Any) -> list[RenderableType]:
    return [
        r.codec,
        r.device,
        _ratio(r.ratio),
        _gbps(r.compress_gbps),
        _gbps(r.decompress_gbps),
        "CPU+GPU" if r.portable else "GPU only",
    ]


def _plans_table(result: BenchResult, part: str = "all") -> Table:
    """The plans: ``all`` columns, or (narrow) the ``time`` or the ``money`` ones."""
    st, cost = result.storage, result.cost
    title = (
        f"checkpoint of {decimal(result.bytes)} on storage writing {_gbps(st.write_gbps)} GB/s, "
        f"reading {_gbps(st.read_gbps)} GB/s ({st.method})"
    )
    times = ("device", "ratio", "write s", "restore s", "saved s")
    money = ("GPU-h/mo", "$ GPUs/mo", "$ storage/mo")
    names = ("codec", *(times if part != "money" else ()), *(money if part != "time" else ()))
    table = Table(title=title if part != "money" else None, box=box.SIMPLE, title_justify="left")
    for name in names:
        table.add_column(name, justify="left" if name in ("codec", "device") else "right", no_wrap=True)
    rec = result.recommendation
    base = {
        "codec": "uncompressed",
        "device": "-",
        "ratio": "1.000×",
        "write s": _gbps(rec.baseline_write_seconds),
        "restore s": _gbps(rec.baseline_restore_seconds),
    }
    table.add_row(*[base.get(n, "-") for n in names])
    for p in result.plans:
        t = p.totals
        cells: dict[str, RenderableType] = {
            "codec": Text(t.codec, style="bold green" if t.codec == rec.codec else ""),
            "device": t.device,
            "ratio": _ratio(t.ratio),
            "write s": _gbps(p.write_seconds),
            "restore s": _gbps(p.restore_seconds),
            "saved s": _gbps(p.stall_saved_seconds, "+"),
            "GPU-h/mo": _fixed(p.idle_gpu_hours_month, 3, "+"),
            "$ GPUs/mo": _usd(p.idle_usd_month),
            "$ storage/mo": _usd(p.storage_usd_month),
        }
        table.add_row(*[cells[n] for n in names])
    if part != "time":
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
                "ratio": finite(r.ratio),
                "compress_gbps": finite(r.compress_gbps),
                "decompress_gbps": finite(r.decompress_gbps),
                "portable": r.portable,
                "bound_ratio": finite(r.bound_ratio),
                "chunk_bound_ratio": finite(r.chunk_bound_ratio),
                "context_bound_ratio": finite(r.context_bound_ratio),
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
                "ratio": finite(p.totals.ratio),
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


def series_bench_view(result: SeriesBenchResult) -> RenderableType:
    """``bench --series``: per component, plain against series-delta ratios and their order-0 bounds.

    Below :data:`NARROW` columns the bounds go to a line of their own under each row.
    """
    return Group(
        Fit(_series_table(result), _series_table(result, narrow=True)),
        Text(
            f"ratios: {result.codec} on a sample of the {result.deltas} files --series codes against the "
            f"next newer checkpoint ({len(result.checkpoints)} checkpoints, {result.tracks} files each; "
            "keyframes aside); bound: order-0 entropy of the byte planes (one histogram per plane), "
            "plain → XOR; delta: share of the component's bytes paired with their counterpart",
            style="dim",
        ),
        Text(
            f"whole run, estimated: {_ratio(result.plain_ratio)} plain, {_ratio(result.series_ratio)} "
            f"with --series ({result.seconds:.1f} s, {result.threads} thread{'s' * (result.threads != 1)})",
            style="bold",
        ),
    )


def _bound(x: float) -> str:
    return "∞" if x == float("inf") else f"{x:.3f}"


def _series_table(result: SeriesBenchResult, narrow: bool = False) -> Table:
    table = Table(title=f"bench --series: {result.root}", box=box.SIMPLE_HEAVY, title_justify="left")
    longest = max((len(r.component) for r in result.rows), default=9)
    table.add_column("component", no_wrap=True, min_width=longest)
    names = ["original", "delta", "plain", "series", "gain"] + ([] if narrow else ["bound plain → XOR"])
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for r in result.rows:
        bound = f"{_bound(r.plain_bound)} → {_bound(r.series_bound)}"
        cells: list[RenderableType] = [
            r.component,
            decimal(r.bytes),
            _share(r.paired_bytes, r.delta_bytes),
            _ratio(r.plain_ratio),
            _ratio(r.series_ratio),
            f"{r.gain:.2f}×",
        ]
        table.add_row(*cells, *([] if narrow else [bound]))
        if narrow:
            table.add_row(Text(f"  bound {bound}", style="dim"), *[""] * (len(cells) - 1))
    table.add_section()
    total = sum(r.bytes for r in result.rows)
    gain = result.series_ratio / result.plain_ratio if result.plain_ratio else float("inf")
    totals: list[RenderableType] = [Text("whole run", style="bold"), decimal(total), ""]
    totals += [_ratio(result.plain_ratio), _ratio(result.series_ratio), f"{gain:.2f}×"]
    table.add_row(*totals, *([] if narrow else [""]))
    return table


def series_bench_json(result: SeriesBenchResult) -> dict[str, Any]:
    """The ``--json`` form of ``bench --series``."""
    return {
        "root": result.root,
        "checkpoints": list(result.checkpoints),
        "tracks": result.tracks,
        "deltas": result.deltas,
        "bytes": result.bytes,
        "codec": result.codec,
        "threads": result.threads,
        "seconds": result.seconds,
        "plain_ratio": finite(result.plain_ratio),
        "series_ratio": finite(result.series_ratio),
        "components": [
            {
                "component": r.component,
                "bytes": r.bytes,
                "delta_bytes": r.delta_bytes,
                "paired_bytes": r.paired_bytes,
                "sample_bytes": r.sample_bytes,
                "plain_ratio": finite(r.plain_ratio),
                "series_ratio": finite(r.series_ratio),
                "gain": finite(r.gain),
                "plain_bound": finite(r.plain_bound),
                "series_bound": finite(r.series_bound),
                "plain_chunk_bound": finite(r.plain_chunk_bound),
                "series_chunk_bound": finite(r.series_chunk_bound),
            }
            for r in result.rows
        ],
    }


def env_view(info: dict[str, Any]) -> Table:
    """``ckptz env``: one row per fact about this installation (:func:`ckptz.environment.describe`)."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    torch, cuda, nvcomp, native = info["torch"], info["cuda"], info["nvcomp"], info["native"]
    gpus = [f"{g['index']}: {g['name']} (sm {g['capability']})" for g in info["gpus"]]
    flags = [native["baseline"], *(f"{f} at run time" for f in native["runtime_dispatch"])]
    rows = [
        ("ckptz", f"{info['ckptz']} ({info['ckptz_path']})"),
        ("Python", info["python"]),
        ("platform", info["platform"]),
        ("torch", torch["version"] or torch.get("error") or "not installed"),
        ("CUDA driver", cuda["driver"] or "none"),
        ("CUDA runtime", cuda["runtime"] or "none"),
        ("nvCOMP", (nvcomp["version"] or "installed") if nvcomp["installed"] else "not installed"),
        ("GPUs", "\n".join(gpus) or f"none ({cuda['problem'] or 'no device visible'})"),
        (
            "native extension",
            ("loaded" if native["loaded"] else "built, turned off" if native["built"] else "not built")
            + (
                f": {', '.join(flags)}; AVX2 loops {'on' if native['avx2'] else 'off'}"
                if native["loaded"]
                else ""
            ),
        ),
        ("kernel cache", info["kernel_cache"]),
        ("settings", "\n".join(f"{k}={v}" for k, v in info["settings"].items()) or "none overridden"),
    ]
    for name, value in rows:
        table.add_row(name, Text(str(value)))
    return table
