"""The ``ckptz`` command line: parse flags, call one :mod:`ckptz.api` function, render the result.

Results go to stdout (Rich tables, or JSON with ``--json``); progress, notices and errors go
to stderr. A :class:`~ckptz.errors.CkptzError` becomes one line on stderr and its exit code
(usage errors 2, a stop by Ctrl-C 130, by SIGTERM 143), and with ``--json`` also an
``{"ok": false, "error": ...}`` object on stdout; set ``CKPTZ_DEBUG=1`` to see its
traceback. Other exceptions are bugs and stay loud. Short options mean what they mean to
``zstd`` (``-o``, ``-c``, ``-f``, ``-T``, ``-q``, ``-v``, ``-h``, ``-V``); options zstd has no
letter for are long only.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperGroup

try:  # Typer 0.24+ carries its own copy of click
    from typer._click.exceptions import NoSuchOption
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # pragma: no cover - older Typer, on click itself
    from click.exceptions import NoSuchOption  # type: ignore[assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

from ckptz import __version__, _signals, settings
from ckptz.devices import warm_named_gpu
from ckptz.errors import CkptzError, PeerFailedError, StoppedError, UnreadableError, UsageError
from ckptz.runs.progress import Progress

if TYPE_CHECKING:
    from ckptz.runs.results import Summary
    from ckptz.runs.share import World


class _Commands(TyperGroup):
    """ckptz's command group: usage errors in one line, like every other error."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except ClickUsageError as exc:
            raise _UsageLine(exc) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ClickUsageError as exc:
            raise _UsageLine(exc) from None


class _UsageLine(ClickUsageError):
    """A usage error shown as ``ckptz: error: MESSAGE (see 'ckptz CMD -h')``. Click's own
    suggestions are kept only where one shares the mistyped option's first letters (it
    offered --device for --series)."""

    def __init__(self, exc: ClickUsageError) -> None:
        message = exc.format_message()
        if isinstance(exc, NoSuchOption):
            close = [p for p in exc.possibilities or () if p[:4] == exc.option_name[:4]]
            message = f"no such option: {exc.option_name}" + (f" (did you mean {close[0]}?)" if close else "")
        super().__init__(message[:1].lower() + message[1:].rstrip("."), exc.ctx)

    def show(self, file: Any = None) -> None:
        where = self.ctx.command_path if self.ctx is not None else "ckptz"
        stderr.print(f"ckptz: error: {self.message} (see '{where} -h')", soft_wrap=True)
        # The options were not parsed, so --json is looked for as it was typed.
        if "--json" in sys.argv[1 : sys.argv.index("--") if "--" in sys.argv else None]:
            _emit_error("UsageError", self.message, None, f"see '{where} -h'", self.exit_code)


def _no_types(self: Any, ctx: Any) -> None:
    """Arguments show their metavar alone, not a Python type (``SOURCE <list[str]>``)."""
    return None


TyperArgument.display_type_rich = _no_types  # type: ignore[method-assign]

app = typer.Typer(
    name="ckptz",
    cls=_Commands,
    help="Lossless, byte-exact compression of PyTorch checkpoints (GPU with nvCOMP, or CPU).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Piped output has no terminal width to fit; 120 columns keep every table readable in logs
# ($COLUMNS still wins). No console markup: paths and messages print as they are
# ("m[gpu].pt" keeps its brackets); styles come from Text objects.
stdout = Console(
    width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120, markup=False, highlight=False
)
stderr = Console(stderr=True, markup=False, highlight=False)

Sources = Annotated[
    list[str],
    typer.Argument(
        help="Checkpoint files or folders; shell patterns work (runs/checkpoint-*). '-' reads stdin.",
        show_default=False,
        metavar="SOURCE",
    ),
]
Paths = Annotated[
    list[str],
    typer.Argument(
        help="Files or folders; shell patterns work (runs/checkpoint-*).", show_default=False, metavar="PATH"
    ),
]
Output = Annotated[
    str | None,
    typer.Option(
        "-o",
        "--output",
        help="Output file or folder; a trailing / makes it a folder; '-' writes to stdout.",
        show_default=False,
        metavar="PATH",
    ),
]
Stdout = Annotated[bool, typer.Option("-c", "--stdout", help="Write to stdout (one file), as zstd -c.")]
InPlace = Annotated[bool, typer.Option("--in-place", help="Replace each file by its converted form, safely.")]
Threads = Annotated[
    int | None,
    typer.Option(
        "-T", "--threads", help="CPU threads [default: all cores].", min=1, metavar="N", show_default=False
    ),
]
Device = Annotated[
    str | None,
    typer.Option(
        "--device",
        help="auto, cpu, cuda or cuda:N [default: $CKPTZ_DEVICE or auto]. cuda[:N] codes every job on"
        " that GPU, compressing and restoring, or fails; auto codes on the CPU threads, with the first"
        " GPU (nvCOMP installed) joining jobs of 32 GiB and more, and a GPU-only codec uses the GPU.",
        show_default=False,
        metavar="DEVICE",
        autocompletion=lambda: ["auto", "cpu", "cuda", "cuda:0"],
    ),
]
Force = Annotated[
    bool,
    typer.Option(
        "-f",
        "--force",
        help="Overwrite existing outputs, and remove from the output folder the containers (compress) or "
        "checkpoints (decompress) whose sources are gone; other files there are left alone. Without -f, "
        "a rerun skips the outputs an earlier run finished and does the rest.",
    ),
]
Memory = Annotated[
    str | None, typer.Option("--memory", help="GPU pipeline buffer budget, e.g. 4GiB.", metavar="SIZE")
]
Json = Annotated[bool, typer.Option("--json", help="Print the result as one JSON object.")]
Quiet = Annotated[bool, typer.Option("-q", "--quiet", help="Print only errors (and --json output).")]
Verbose = Annotated[bool, typer.Option("-v", "--verbose", help="List every file as it is done.")]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="No progress bar or progress lines.")]
DryRun = Annotated[
    bool, typer.Option("--dry-run", help="Show what would be done (and saved, from a sample); write nothing.")
]
Include = Annotated[
    list[str] | None,
    typer.Option(
        "--include",
        help="Convert only files matching this pattern (path or name; repeatable), whatever their content.",
        show_default=False,
        metavar="PATTERN",
    ),
]
Exclude = Annotated[
    list[str] | None,
    typer.Option(
        "--exclude",
        help="Never convert files matching this pattern (repeatable); with -o they are copied unchanged.",
        show_default=False,
        metavar="PATTERN",
    ),
]
SkipUnreadable = Annotated[
    bool,
    typer.Option(
        "--skip-unreadable",
        help="Leave out files this user cannot read (each named on stderr) instead of refusing to run.",
    ),
]
Nproc = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        help="Split the files by bytes over N processes on this machine (under torchrun: ignored).",
        min=1,
        metavar="N",
        show_default=False,
    ),
]

F = TypeVar("F", bound=Callable[..., Any])


def _errors(fn: F) -> F:
    """Turn ckptz's own errors (and OS errors on user paths) into one stderr line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            _signals.arm()
            return fn(*args, **kwargs)
        except (CkptzError, OSError) as exc:
            if settings.value("debug"):
                raise
            code = exc.exit_code if isinstance(exc, CkptzError) else 1
            if isinstance(exc, PeerFailedError) and exc.quiet:
                _signals.announced.append(True)  # rank 0 reports it
                raise typer.Exit(code) from None
            if isinstance(exc, BrokenPipeError):
                # The reader of stdout went away (`| head`): say so once, and keep Python
                # from failing again when it flushes stdout at exit.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                exc = OSError(exc.errno, "stdout was closed before everything was written")
            if isinstance(exc, StoppedError):
                code = _signals.exit_code()
            if isinstance(exc, UnreadableError):
                for path, why in exc.files:  # one line each: which files, and why
                    stderr.print(f"ckptz: {path}: {why}", soft_wrap=True)
            where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
            text = str(exc) if isinstance(exc, CkptzError) else f"{where}{exc.strerror or exc}"
            if isinstance(exc, StoppedError):
                _signals.announced.append(True)
            stderr.print(f"ckptz: {'error: ' * (not isinstance(exc, StoppedError))}{text}", soft_wrap=True)
            if kwargs.get("as_json"):
                if isinstance(exc, CkptzError):
                    _emit_error(type(exc).__name__, exc.message, exc.path, exc.hint, code)
                else:
                    _emit_error(type(exc).__name__, exc.strerror or str(exc), exc.filename, None, code)
            raise typer.Exit(code) from None
        except KeyboardInterrupt:
            _signals.announced.append(True)
            stderr.print("ckptz: stopped (run the same command again to finish anything left)")
            if kwargs.get("as_json"):
                _emit_error(
                    "StoppedError", "stopped", None, "run the same command again", _signals.exit_code()
                )
            raise typer.Exit(_signals.exit_code()) from None

    return wrapper  # type: ignore[return-value]


#: Whether this command has printed its JSON result (a later error then adds no second object).
_json_done: list[bool] = []


def _emit(data: dict[str, Any] | None, view: Any, as_json: bool, quiet: bool = False) -> None:
    if as_json:
        _json_done.append(True)
        sys.stdout.write(json.dumps(_strict(data), indent=2, default=str, allow_nan=False) + "\n")
    elif not quiet:
        _print(view)


def _emit_error(kind: str, message: str, path: Any, hint: str | None, exit_code: int) -> None:
    """A failed command's ``--json`` output: one object that says it failed, and why (the
    same error as the stderr line), so a script that parses stdout always gets JSON."""
    if _json_done:
        return
    error = {
        "type": kind,
        "message": message,
        "path": path and str(path),
        "hint": hint,
        "exit_code": exit_code,
    }
    sys.stdout.write(json.dumps({"ok": False, "error": error}, indent=2) + "\n")
    sys.stdout.flush()


def _print(view: Any) -> None:
    """``view`` on stdout; piped, without the spaces that pad its lines to the table's width
    (they only make logs wider and diffs noisier)."""
    if stdout.is_terminal:
        stdout.print(view)
        return
    with stdout.capture() as captured:
        stdout.print(view)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None: strict parsers reject NaN/Infinity."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def _progress(quiet: bool, no_progress: bool, verbose: bool, world: World | None = None) -> Progress:
    if world is not None and not world.leader:
        quiet = True  # under torchrun, rank 0 alone reports
    return Progress(stderr, show=not (quiet or no_progress), quiet=quiet, verbose=verbose)


def _world(nproc: int | None) -> World | None:
    """This rank's place under torchrun; with ``--nproc N`` outside it, run N ranks and exit."""
    from ckptz.runs.share import World

    world = World.from_env()
    if world is None and nproc is not None and nproc > 1:
        from ckptz.runs.launch import spawn

        code = spawn(nproc, sys.argv[1:])
        _signals.announced.append(True)  # the ranks said everything
        raise typer.Exit(code)
    return world


def _call(world: World | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or under torchrun this rank's share of it (the merged result)."""
    if world is None:
        return fn(*args, **kwargs)
    from ckptz.runs.distributed import across

    return across(world, fn, *args, **kwargs)


def _leads(world: World | None) -> bool:
    return world is None or world.leader


def _no_stdin(paths: list[str]) -> None:
    if "-" in paths:
        raise UsageError(
            "'-' (stdin) is read by compress and decompress only",
            hint="save the stream to a file and name it",
        )


def _one_process(nproc: int | None) -> None:
    from ckptz.runs.share import World

    if (nproc or 1) > 1 or World.from_env() is not None:
        raise UsageError("a stream is one file in one process", hint="run it without torchrun or --nproc")


def _stream_out(output: str | None, to_stdout: bool) -> bool:
    if to_stdout and output not in (None, "-"):
        raise UsageError("-c/--stdout and -o FILE exclude each other")
    return to_stdout or output == "-"


def _binary_stdout() -> Any:
    if sys.stdout.isatty():
        raise UsageError("refusing to write binary data to a terminal", hint="redirect stdout or use -o FILE")
    return sys.stdout.buffer


def _binary_stdin() -> Any:
    if sys.stdin.isatty():
        raise UsageError("refusing to read binary data from a terminal", hint="redirect stdin or name a file")
    return sys.stdin.buffer


def _stream(
    command: str,
    sources: list[str],
    output: str | None,
    to_stdout: bool,
    as_json: bool,
    ui: Progress,
    **kw: Any,
) -> None:
    """``-`` as the source or the output: one file through a pipe, like ``zstd -c``/``zstd -d``."""
    from ckptz import api

    if len(sources) != 1:
        raise UsageError("a stream carries one file", hint="give one source with -c or '-'")
    out_is_stdout = to_stdout or output in (None, "-")
    if out_is_stdout and as_json:
        raise UsageError("--json cannot share stdout with the data", hint="write the data with -o FILE")
    src: Any = _binary_stdin() if sources[0] == "-" else sources[0]
    out: Any = _binary_stdout() if out_is_stdout else output
    fn = api.compress_stream if command == "compress" else api.decompress_stream
    with ui:
        summary = fn(src, out, reporter=ui, **kw)
    from ckptz.report import notes, summary_json

    for line in notes(summary.actions, ui.verbose):
        ui.notice(line)
    if as_json:
        _emit(summary_json(summary), None, True)


def _show(
    summary: Summary, ui: Progress, *, as_json: bool, quiet: bool, verbose: bool, dry_run: bool
) -> None:
    """A compress or decompress result: notes on stderr, the summary (or JSON) on stdout."""
    from ckptz.report import actions_table, notes, summary_json, summary_view, unreadable_checkpoints

    for line in notes(summary.actions, verbose) + unreadable_checkpoints(summary.files) * (
        summary.operation == "compress"
    ):
        ui.notice(line)
    _emit(summary_json(summary) if as_json else None, summary_view(summary, verbose), as_json, quiet)
    if verbose and dry_run and not as_json:
        _print(actions_table(summary.actions))


@app.command(short_help="Compress checkpoint files and folders: each checkpoint X becomes X.ckptz.")
@_errors
def compress(
    sources: Sources,
    output: Output = None,
    to_stdout: Stdout = False,
    in_place: InPlace = False,
    include: Include = None,
    exclude: Exclude = None,
    level: Annotated[
        int,
        typer.Option(
            "--level",
            help="zstd level for coded planes (1-22). On the CPU, every level tries order-1 and row-predicted exponents on floats where a sample says they pay (Adam's second moments) and row-predicted signs; from 10, an archive level, it tries them on every float, and codes float mantissas' top bits given their exponents where that is smaller: more CPU time for a little more ratio.",
            min=1,
            max=22,
            metavar="N",
        ),
    ] = 3,
    threads: Threads = None,
    device: Device = None,
    codec: Annotated[
        str,
        typer.Option(
            "--codec",
            help="auto (portable zstd; decodes anywhere), zstd, or ans (nvCOMP ANS: fastest, decodes on GPUs only).",
            metavar="CODEC",
            autocompletion=lambda: ["auto", "zstd", "ans"],
        ),
    ] = "auto",
    fast: Annotated[
        bool,
        typer.Option(
            "--fast",
            help="Same as --codec ans: fastest, but only a GPU can write or restore it (an error without one).",
        ),
    ] = False,
    memory: Memory = None,
    verify: Annotated[
        bool | None,
        typer.Option(
            "--verify/--no-verify", help="Decode and compare before finishing [default: in place only]."
        ),
    ] = None,
    force: Force = False,
    dry_run: DryRun = False,
    series: Annotated[
        bool,
        typer.Option(
            "--series",
            help="SOURCE is a run folder (checkpoint-N/, step_N, ...): code each checkpoint against "
            "the next newer one (reverse deltas; the newest stays self-contained).",
        ),
    ] = False,
    keyframe_every: Annotated[
        int,
        typer.Option(
            "--keyframe-every",
            help="With --series: a restore decodes at most K containers.",
            min=1,
            metavar="K",
        ),
    ] = 8,
    skip_unreadable: SkipUnreadable = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    no_progress: NoProgress = False,
    as_json: Json = False,
    nproc: Nproc = None,
) -> None:
    """Compress checkpoint files and folders: each checkpoint X becomes X.ckptz.

    Checkpoints are recognised by content (torch zip, pickle, safetensors) or suffix; other
    files are copied unchanged with -o and left alone in place. Permission bits, mtimes,
    empty folders, symlinks and hard links are kept.
    """
    chosen = "ans" if fast and codec == "auto" else codec
    warm_named_gpu(device, chosen)  # the CUDA context comes up while the modules below load
    from ckptz import api

    ui = _progress(quiet, no_progress, verbose)
    if sources == ["-"] or _stream_out(output, to_stdout):
        _one_process(nproc)
        if in_place or dry_run:
            raise UsageError("--in-place and --dry-run do not apply to streams")
        opts = dict(
            level=level, threads=threads, device=device, codec=chosen, memory=_size(memory), force=force
        )
        _stream("compress", sources, output, to_stdout, as_json, ui, **opts)
        return
    world = _world(nproc)
    ui = _progress(quiet, no_progress, verbose, world)
    with ui:
        summary = _call(
            world,
            api.compress,
            sources,
            output,
            in_place=in_place,
            level=level,
            threads=threads,
            device=device,
            codec=chosen,
            memory=_size(memory),
            verify=verify,
            force=force,
            include=include or (),
            exclude=exclude or (),
            dry_run=dry_run,
            reporter=ui,
            series=series,
            keyframe_every=keyframe_every,
            skip_unreadable=skip_unreadable,
        )
    if _leads(world):
        _show(summary, ui, as_json=as_json, quiet=quiet, verbose=verbose, dry_run=dry_run)


@app.command(short_help="Make series containers (compress --series) self-contained again, in place.")
@_errors
def detach(
    paths: Paths,
    threads: Threads = None,
    device: Device = None,
    quiet: Quiet = False,
    verbose: Verbose = False,
    no_progress: NoProgress = False,
    as_json: Json = False,
) -> None:
    """Make series containers (compress --series) self-contained again, in place.

    Do this before deleting or moving a checkpoint away from its run: the containers coded
    against it (older checkpoints) still restore, and it no longer needs newer ones.
    """
    _no_stdin(paths)
    from ckptz import api

    ui = _progress(quiet, no_progress, verbose)
    with ui:
        summary = api.detach(paths, threads=threads, device=device, reporter=ui)
    _show(summary, ui, as_json=as_json, quiet=quiet, verbose=verbose, dry_run=False)


@app.command(short_help="Restore .ckptz containers to byte-identical originals, with their metadata.")
@_errors
def decompress(
    sources: Sources,
    output: Output = None,
    to_stdout: Stdout = False,
    in_place: InPlace = False,
    include: Include = None,
    exclude: Exclude = None,
    threads: Threads = None,
    device: Device = None,
    memory: Memory = None,
    force: Force = False,
    dry_run: DryRun = False,
    skip_unreadable: SkipUnreadable = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    no_progress: NoProgress = False,
    as_json: Json = False,
    nproc: Nproc = None,
) -> None:
    """Restore .ckptz containers to byte-identical originals, with their metadata.

    Naming a file that is not a container is an error; other files in a folder are copied
    unchanged with -o and left alone in place.
    """
    from ckptz import api

    ui = _progress(quiet, no_progress, verbose)
    if sources == ["-"] or _stream_out(output, to_stdout):
        _one_process(nproc)
        if in_place or dry_run:
            raise UsageError("--in-place and --dry-run do not apply to streams")
        _stream(
            "decompress",
            sources,
            output,
            to_stdout,
            as_json,
            ui,
            threads=threads,
            device=device,
            memory=_size(memory),
            force=force,
        )
        return
    world = _world(nproc)
    ui = _progress(quiet, no_progress, verbose, world)
    with ui:
        summary = _call(
            world,
            api.decompress,
            sources,
            output,
            in_place=in_place,
            threads=threads,
            device=device,
            memory=_size(memory),
            force=force,
            include=include or (),
            exclude=exclude or (),
            dry_run=dry_run,
            reporter=ui,
            skip_unreadable=skip_unreadable,
        )
    if _leads(world):
        _show(summary, ui, as_json=as_json, quiet=quiet, verbose=verbose, dry_run=dry_run)


@app.command(short_help="Show what each component costs (raw checkpoint) or saves (compressed one).")
@_errors
def inspect(paths: Paths, as_json: Json = False) -> None:
    """Show what each component costs (raw checkpoint) or saves (compressed one)."""
    _no_stdin(paths)
    from ckptz import api
    from ckptz.report import summary_json, summary_view

    summary = api.inspect(paths)
    _emit(summary_json(summary) if as_json else None, summary_view(summary), as_json)
    failed = [f for f in summary.files if f.error is not None]
    for f in failed:  # one line each, also beside --json, as verify reports its damaged files
        if f.format not in _REFERENCE_STATUSES:
            stderr.print(f"ckptz: error: {f.error}", soft_wrap=True)
    # One gone reference leaves every container coded against it unusable: one line says it.
    broken = [f for f in failed if f.format in _REFERENCE_STATUSES]
    if broken:
        others = len(broken) - 1
        more = f" (and {others} more file{'s' * (others != 1)})" if others else ""
        stderr.print(f"ckptz: error: {broken[0].error}{more}", soft_wrap=True)
    if failed:
        raise typer.Exit(1)


#: Verdicts that one gone or replaced series reference gives every container coded against it.
_REFERENCE_STATUSES = ("missing reference", "changed reference")


@app.command(short_help="Check that containers restore exactly: exit 0 only if every file matches.")
@_errors
def verify(
    paths: Paths,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="The original file or folder: restoring PATH must give exactly it "
            "(missing, extra and changed files fail).",
            show_default=False,
            metavar="SRC",
        ),
    ] = None,
    threads: Threads = None,
    device: Device = None,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="List only the files that failed.")] = False,
    skip_unreadable: SkipUnreadable = False,
    no_progress: NoProgress = False,
    as_json: Json = False,
    nproc: Nproc = None,
) -> None:
    """Check that containers restore exactly: exit 0 only if every file matches.

    With --against, the two trees are compared file by file (containers decoded in a
    stream, nothing written); without it, every container is decoded and its checksums
    checked, and the files it could not check are listed. A series container whose
    reference is gone or damaged is "missing reference"; one whose reference is there but
    another file is "changed reference".
    """
    _no_stdin(paths)
    from ckptz import api
    from ckptz.report import verify_json, verify_view

    world = _world(nproc)
    ui = _progress(quiet, no_progress, False, world)
    with ui:
        result = _call(
            world,
            api.verify,
            paths,
            against,
            threads=threads,
            device=device,
            reporter=ui,
            skip_unreadable=skip_unreadable,
        )
    if _leads(world):
        _emit(verify_json(result) if as_json else None, verify_view(result, problems_only=quiet), as_json)
        for c in result.files:
            if c.status in ("unreadable", "skipped"):  # one line each, also beside --json
                stderr.print(f"ckptz: {c.error}" + "; skipped" * (c.status == "skipped"), soft_wrap=True)
        broken = [c for c in result.files if c.status in _REFERENCE_STATUSES]
        if broken:
            others = len(broken) - 1
            more = f" (and {others} more file{'s' * (others != 1)})" if others else ""
            stderr.print(f"ckptz: error: {broken[0].error}{more}", soft_wrap=True)
    if not result.ok:
        raise typer.Exit(1)


@app.command(
    short_help="Measure every codec on your checkpoint and its storage; recommend one and project the savings."
)
@_errors
def bench(
    path: Annotated[
        Path, typer.Argument(help="A checkpoint file or folder.", show_default=False, metavar="PATH")
    ],
    device: Device = None,
    codecs: Annotated[
        str | None,
        typer.Option(
            "--codecs",
            help="Comma-separated configurations: ckptz-auto, ckptz-zstd, ckptz-zstd-gpu, ckptz-ans-gpu, "
            "zstd-raw, nvcomp-zstd-raw, nvcomp-ans-raw [default: all that can run here].",
            show_default=False,
            metavar="LIST",
        ),
    ] = None,
    sample: Annotated[
        str,
        typer.Option(
            "--sample",
            help="Bytes sampled per component; smaller components are taken whole.",
            metavar="SIZE",
        ),
    ] = "256MiB",
    storage: Annotated[
        Path | None,
        typer.Option(
            "--storage",
            help="A folder on the checkpoint storage to measure [default: the folder the checkpoint is in].",
            show_default=False,
            metavar="DIR",
        ),
    ] = None,
    storage_gbps: Annotated[
        float | None,
        typer.Option(
            "--storage-gbps",
            help="Storage bandwidth in GB/s, instead of measuring it.",
            show_default=False,
            metavar="GBPS",
        ),
    ] = None,
    threads: Threads = None,
    repeats: Annotated[
        int, typer.Option("--repeats", help="Timed runs per measurement (median).", min=3, metavar="N")
    ] = 3,
    gpus: Annotated[
        int, typer.Option("--gpus", help="GPUs idle while a checkpoint is saved.", min=1, metavar="N")
    ] = 8,
    gpu_hour_usd: Annotated[
        float, typer.Option("--gpu-hour-usd", help="Price of a GPU-hour (USD).", min=0, metavar="USD")
    ] = 2.5,
    every_min: Annotated[
        float, typer.Option("--every-min", help="Minutes between checkpoints.", min=0.1, metavar="MIN")
    ] = 30.0,
    storage_usd_tb_month: Annotated[
        float,
        typer.Option(
            "--storage-usd-tb-month", help="Price of a TB-month of storage (USD).", min=0, metavar="USD"
        ),
    ] = 20.0,
    keep: Annotated[
        int, typer.Option("--keep", help="Checkpoints kept at any time.", min=1, metavar="N")
    ] = 5,
    series: Annotated[
        bool,
        typer.Option(
            "--series",
            help="PATH is a run folder (checkpoint-N/, step_N, ...): estimate per component what "
            "compress --series gains over compressing each checkpoint alone, with the order-0 "
            "bounds (the codec and storage options other than --sample and -T do not apply).",
        ),
    ] = False,
    quiet: Quiet = False,
    no_progress: NoProgress = False,
    as_json: Json = False,
) -> None:
    """Measure every codec on your checkpoint and its storage; recommend one and project the savings.

    The storage measured is where the checkpoint lives, unless --storage or --storage-gbps
    says otherwise.
    """
    from ckptz.bench.benchmark import bench as run_bench
    from ckptz.bench.savings import CostModel
    from ckptz.report import bench_json, bench_view

    if series:
        from ckptz.bench.series import bench_series
        from ckptz.report import series_bench_json, series_bench_view

        ui = _progress(quiet, no_progress, False)
        with ui:
            estimate = bench_series(path, sample_bytes=_size(sample) or 1, threads=threads, reporter=ui)
        _emit(series_bench_json(estimate) if as_json else None, series_bench_view(estimate), as_json, quiet)
        return
    if storage is None and storage_gbps is None:
        storage = path if path.is_dir() else path.parent
    ui = _progress(quiet, no_progress, False)
    with ui:
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
            reporter=ui,
        )
    _emit(bench_json(result) if as_json else None, bench_view(result), as_json, quiet)


@app.command(
    short_help="Show the versions, GPUs, native build and settings ckptz runs with, for a bug report."
)
@_errors
def env(as_json: Json = False) -> None:
    """Show the versions, GPUs, native build and settings ckptz runs with (for a bug report)."""
    from ckptz.environment import describe
    from ckptz.report import env_view

    info = describe()
    _emit(info, env_view(info), as_json)


def _size(text: str | None) -> int | None:
    if text is None:
        return None
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
    except (ValueError, KeyError, OverflowError):  # OverflowError: "inf", "1e400"
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
        bool,
        typer.Option("-V", "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Lossless, byte-exact compression of PyTorch checkpoints."""
