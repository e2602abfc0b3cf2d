"""The ``ckptz`` command line: parse flags, call one :mod:`ckptz.api` function, render the result.

Results go to stdout (Rich tables, or JSON with ``--json``); progress, notices and errors go
to stderr. A :class:`~ckptz.errors.CkptzError` becomes one line on stderr and exit code 1
(usage errors 2); set ``CKPTZ_DEBUG=1`` to see its traceback. Other exceptions are bugs and
stay loud.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ckptz import __version__
from ckptz.errors import CkptzError

app = typer.Typer(
    name="ckptz",
    help="Lossless, byte-exact compression of PyTorch checkpoints (GPU with nvCOMP, or CPU).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Piped output has no terminal width to fit; 120 columns keep every table readable in logs.
# No console markup: paths and messages print as they are ("m[gpu].pt" keeps its brackets);
# styles come from Text objects.
stdout = Console(width=None if sys.stdout.isatty() else 120, markup=False)
stderr = Console(stderr=True, markup=False)

Src = Annotated[Path, typer.Argument(help="A checkpoint file or folder.", show_default=False)]
Output = Annotated[
    Path | None, typer.Option("-o", "--output", help="Output file or folder.", show_default=False)
]
InPlace = Annotated[bool, typer.Option("--in-place", help="Replace each file by its converted form, safely.")]
Threads = Annotated[
    int | None, typer.Option("--threads", "-t", help="CPU threads [default: all cores].", min=1)
]
Device = Annotated[
    str | None,
    typer.Option(
        "--device",
        "-d",
        help="auto, cpu, cuda or cuda:N [default: $CKPTZ_DEVICE or auto: the first GPU with nvCOMP, else the CPU].",
        show_default=False,
    ),
]
Force = Annotated[bool, typer.Option("--force", help="Overwrite existing outputs.")]
Json = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")]

F = TypeVar("F", bound=Callable[..., Any])


def _errors(fn: F) -> F:
    """Turn ckptz's own errors (and OS errors on user paths) into one stderr line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CkptzError, OSError) as exc:
            if os.environ.get("CKPTZ_DEBUG"):
                raise
            code = exc.exit_code if isinstance(exc, CkptzError) else 1
            text = str(exc) if isinstance(exc, CkptzError) else f"{exc.filename or ''}: {exc.strerror or exc}"
            stderr.print(f"ckptz: error: {text}", highlight=False, soft_wrap=True)
            raise typer.Exit(code) from None
        except KeyboardInterrupt:
            stderr.print("ckptz: interrupted; inputs are untouched, rerun to finish", highlight=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


class _Bar:
    """A Rich progress bar on stderr, drawn only on a terminal."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            DownloadColumn(binary_units=False),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[file]}", style="dim", markup=False),
            console=stderr,
            transient=True,
            disable=not stderr.is_terminal,
        )
        self.task: TaskID | None = None

    def start(self, total: int, description: str) -> None:
        self.progress.start()
        self.task = self.progress.add_task(description, total=total, file="")

    def advance(self, nbytes: int) -> None:
        if self.task is not None:
            self.progress.advance(self.task, nbytes)

    def file(self, relpath: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, file=relpath)

    def notice(self, text: str) -> None:
        stderr.print(f"ckptz: {text}", highlight=False)

    def close(self) -> None:
        self.progress.stop()


def _emit(data: dict[str, Any] | None, view: Any, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        stdout.print(view)


@app.command()
@_errors
def compress(
    src: Src,
    output: Output = None,
    in_place: InPlace = False,
    level: Annotated[
        int, typer.Option("--level", "-l", help="zstd level for coded planes (1-22).", min=1, max=22)
    ] = 3,
    threads: Threads = None,
    device: Device = None,
    codec: Annotated[
        str,
        typer.Option(
            "--codec",
            "-c",
            help="auto (portable zstd; decodes anywhere), zstd, or ans (nvCOMP ANS: fastest, decodes on GPUs only).",
        ),
    ] = "auto",
    fast: Annotated[
        bool, typer.Option("--fast", help="Prefer speed over portability: --codec ans on a GPU.")
    ] = False,
    memory: Annotated[
        str | None, typer.Option("--memory", help="GPU pipeline buffer budget, e.g. 4GiB.")
    ] = None,
    verify: Annotated[
        bool | None,
        typer.Option(
            "--verify/--no-verify", help="Decode and compare before finishing [default: in place only]."
        ),
    ] = None,
    force: Force = False,
    as_json: Json = False,
) -> None:
    """Compress a checkpoint file or folder: each checkpoint X becomes X.ckptz."""
    from ckptz import api
    from ckptz.report import summary_json, summary_view

    bar = _Bar()
    try:
        summary = api.compress(
            src,
            output,
            in_place=in_place,
            level=level,
            threads=threads,
            device=device,
            codec="ans" if fast and codec == "auto" else codec,
            memory=_size(memory),
            verify=verify,
            force=force,
            reporter=bar,
        )
    finally:
        bar.close()
    _emit(summary_json(summary) if as_json else None, None if as_json else summary_view(summary), as_json)


@app.command()
@_errors
def decompress(
    src: Src,
    output: Output = None,
    in_place: InPlace = False,
    threads: Threads = None,
    device: Device = None,
    force: Force = False,
    as_json: Json = False,
) -> None:
    """Restore .ckptz containers to byte-identical originals."""
    from ckptz import api
    from ckptz.report import summary_json, summary_view

    bar = _Bar()
    try:
        summary = api.decompress(
            src, output, in_place=in_place, threads=threads, device=device, force=force, reporter=bar
        )
    finally:
        bar.close()
    _emit(summary_json(summary) if as_json else None, None if as_json else summary_view(summary), as_json)


@app.command()
@_errors
def inspect(path: Src, as_json: Json = False) -> None:
    """Show what each component costs (raw checkpoint) or saves (compressed one)."""
    from ckptz import api
    from ckptz.report import summary_json, summary_view

    summary = api.inspect(path)
    _emit(summary_json(summary) if as_json else None, None if as_json else summary_view(summary), as_json)


@app.command()
@_errors
def verify(
    path: Src,
    against: Annotated[
        Path | None, typer.Option("--against", help="Original file or folder to compare byte for byte.")
    ] = None,
    threads: Threads = None,
    device: Device = None,
    as_json: Json = False,
) -> None:
    """Decode every container and check every checksum; exit 0 only if all match."""
    from ckptz import api
    from ckptz.report import verify_json, verify_view

    bar = _Bar()
    try:
        result = api.verify(path, against, threads=threads, device=device, reporter=bar)
    finally:
        bar.close()
    _emit(verify_json(result) if as_json else None, None if as_json else verify_view(result), as_json)
    if not result.ok:
        raise typer.Exit(1)


@app.command()
@_errors
def bench(
    path: Src,
    device: Device = None,
    codecs: Annotated[
        str | None,
        typer.Option(
            "--codecs",
            help="Comma-separated configurations: ckptz-auto, ckptz-zstd, ckptz-zstd-gpu, ckptz-ans-gpu, "
            "zstd-raw, nvcomp-zstd-raw, nvcomp-ans-raw [default: all that can run here].",
            show_default=False,
        ),
    ] = None,
    sample: Annotated[
        str, typer.Option("--sample", help="Bytes sampled per component; smaller components are taken whole.")
    ] = "256MiB",
    storage: Annotated[
        Path | None,
        typer.Option(
            "--storage",
            help="A folder on the checkpoint storage: its bandwidth is measured.",
            show_default=False,
        ),
    ] = None,
    storage_gbps: Annotated[
        float | None,
        typer.Option(
            "--storage-gbps", help="Storage bandwidth in GB/s, instead of --storage.", show_default=False
        ),
    ] = None,
    threads: Threads = None,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Timed runs per measurement (median).", min=3)
    ] = 3,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs idle while a checkpoint is saved.", min=1)] = 8,
    gpu_hour_usd: Annotated[
        float, typer.Option("--gpu-hour-usd", help="Price of a GPU-hour (USD).", min=0)
    ] = 2.5,
    every_min: Annotated[
        float, typer.Option("--every-min", help="Minutes between checkpoints.", min=0.1)
    ] = 30.0,
    storage_usd_tb_month: Annotated[
        float, typer.Option("--storage-usd-tb-month", help="Price of a TB-month of storage (USD).", min=0)
    ] = 20.0,
    keep: Annotated[int, typer.Option("--keep", help="Checkpoints kept at any time.", min=1)] = 5,
    as_json: Json = False,
) -> None:
    """Measure every codec on your checkpoint and storage; recommend one and project the savings."""
    from ckptz.bench.benchmark import bench as run_bench
    from ckptz.bench.savings import CostModel
    from ckptz.report import bench_json, bench_view

    bar = _Bar()
    try:
        result = run_bench(
            path,
            device=device,
            codecs=[c.strip() for c in codecs.split(",") if c.strip()] if codecs else None,
            sample_bytes=_size(sample) or 1,
            storage_dir=storage,
            storage_gbps=storage_gbps,
            threads=threads,
            repeats=repeats,
            cost=CostModel(gpus, gpu_hour_usd, every_min, storage_usd_tb_month, keep),
            reporter=bar,
        )
    finally:
        bar.close()
    _emit(bench_json(result) if as_json else None, None if as_json else bench_view(result), as_json)


def _size(text: str | None) -> int | None:
    if text is None:
        return None
    from ckptz.errors import UsageError

    units = {
        "": 1,
        "k": 1e3,
        "m": 1e6,
        "g": 1e9,
        "t": 1e12,
        "kib": 1 << 10,
        "mib": 1 << 20,
        "gib": 1 << 30,
        "tib": 1 << 40,
    }
    s = text.strip().lower().removesuffix("b") if not text.lower().endswith("ib") else text.strip().lower()
    num = s.rstrip("kmgtib")
    unit = s[len(num) :]
    try:
        value = int(float(num) * units[unit])
    except (ValueError, KeyError):
        raise UsageError(f"cannot read size {text!r}", hint="write e.g. 4GiB or 512MB") from None
    if value <= 0:
        raise UsageError(f"size must be positive: {text!r}")
    return value


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ckptz {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Lossless, byte-exact compression of PyTorch checkpoints."""


def main() -> None:
    """Console-script entry point."""
    app()
