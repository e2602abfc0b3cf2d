"""An engine in a process of its own: the GPU engine's Python off the pipeline's GIL.

The pipeline and the GPU engine each run faster alone than together in one process, where
they share one GIL, so a GPU engine can run in a child process
(``CKPTZ_ENGINE_PROCESS=1``), and :class:`ProcessEngine` stands in for it in the caller,
behind the same :class:`~ckptz.engines.base.Engine` protocol. End to end it measured no
faster, and a fresh command is slower (its child pins its buffers anew), so it is off by
default; it is kept for what it isolates (a fault in the GPU's libraries ends the child, and
the run reports it).

The bytes never cross the socket. Both processes map the same memory files (``memfd``):

- The caller's buffers (:meth:`ProcessEngine.host_buffer`, which its readers fill) are its
  own shared regions; the engine's process maps each the first time a call names it and
  registers it with CUDA, so the GPU copies from it straight away, as from its own pinned
  memory.
- The engine's results (a span's coded block, frames decoded into buffers of its own) lie in
  its own pinned pool, whose regions are shared the same way; the caller maps each the first
  time a result names it.

A call or a result is pickled with every array that lies in a shared region replaced by a
reference (:class:`_Wire`): its region, offset and shape. The engine's process holds what a
result references until the caller has let go of the last view of it (a ``drop`` message
from a finalizer), so its pool reuses the memory only then; the caller holds what a call
references until its result is back. A region either side lets go of (its pool's ``KEEP``)
is ``forget``-ed by the other.

The child dies with the thread that started it (``PR_SET_PDEATHSIG``) and ignores Ctrl-C,
which the caller handles; if it dies, every call in flight fails and the run reports it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import io
import itertools
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ckptz import children, trace
from ckptz.container import StreamInfo
from ckptz.engines.base import (
    DecodedSpan,
    EncodedFrame,
    EncodedSpan,
    Engine,
    FrameToCode,
    Place,
    Ranges,
    StoredChunk,
    StoredSpan,
)
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.gpu.pinned import PinnedPool, Region
from ckptz.errors import CkptzError

#: Arrays smaller than this cross the socket as bytes, not as references.
MIN_SHARED = 4096
#: How long a closed engine's process may take to end before it is killed.
GRACE_S = 5.0
#: The child's thread switch interval (the pipeline's, :mod:`ckptz.pipeline.workers`).
SWITCH_INTERVAL_S = 0.0002
#: Where the caller's buffers and the engine's results live: each side's own regions.
CALLER, ENGINE = "caller", "engine"


class EngineDiedError(CkptzError):
    """The engine's process ended while coding."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(
            "the GPU engine's process ended unexpectedly" + (f" ({detail})" if detail else ""),
            hint="run again; CKPTZ_ENGINE_PROCESS=0 codes in this process",
        )


# -- the wire: pickles whose shared arrays are references -------------------------------------


class _Wire:
    """One side of the socket: its pool (its own shared regions, and the other side's it has
    mapped), the regions the other side has been sent, and what it holds for the other side.

    Args:
        side: :data:`CALLER` or :data:`ENGINE`.
        sock: the socket to the other side.
        pin: register the other side's regions with CUDA when mapping them.
        keep: free bytes of its own regions its pool keeps.
    """

    def __init__(self, side: str, sock: socket.socket, pin: bool, keep: int | None = None) -> None:
        self.side = side
        self.sock = sock
        self._pin = pin
        self._numbers = itertools.count()
        options = {} if keep is None else {"keep": keep}
        self.pool = PinnedPool(make=self._make, forget=self._forgotten, **options)
        self._lock = threading.Lock()  # around every send
        self._sent: set[object] = set()  # our regions the other side has mapped
        self._theirs: dict[object, Region] = {}  # the other side's regions mapped here
        self._mine: weakref.WeakValueDictionary[object, Region] = weakref.WeakValueDictionary()
        #: Drops and forgets, queued from finalizers (which may run inside a send) and sent
        #: by a thread of their own.
        self._outbox: queue.SimpleQueue[tuple[str, object] | None] = queue.SimpleQueue()
        self._mailer = threading.Thread(target=self._mail, name=f"ckptz-{side}-mail", daemon=True)
        self._mailer.start()

    def _make(self, size: int) -> Region:
        region = Region(size, shared=True, pin=self._pin, key=(self.side, next(self._numbers)))
        self._mine[region.key] = region
        return region

    def _forgotten(self, region: Region) -> None:
        if region.key in self._sent:
            self._sent.discard(region.key)
            self._outbox.put(("forget", region.key))

    # -- sending --------------------------------------------------------------------------

    def pack(self, payload: object) -> _Packed:
        """``payload`` pickled, shared arrays as references (:class:`_Pickler`)."""
        data = io.BytesIO()
        pickler = _Pickler(data, self)
        pickler.dump(payload)
        return _Packed(data.getvalue(), pickler.regions, pickler.own)

    def send(self, message: tuple[Any, ...], payload: object = None) -> list[np.ndarray]:
        """Send ``message`` with ``payload`` after it (:meth:`pack`; a packed one as it is),
        passing any of our regions the other side lacks beside it; return the arrays of our
        own regions it references, for the caller to hold."""
        packed = payload if isinstance(payload, _Packed) else self.pack(payload)
        with self._lock:
            new = [r for r in packed.regions if r.key not in self._sent]
            self._sent.update(r.key for r in new)
            children.send(
                self.sock, (*message, [(r.key, r.size) for r in new], packed.data), [r.fd for r in new]
            )
        return packed.own

    def close_outbox(self) -> None:
        self._outbox.put(None)
        self._mailer.join()

    def _mail(self) -> None:
        while (item := self._outbox.get()) is not None:
            items = [item]
            while True:  # whatever else is queued goes in the same message
                try:
                    more = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._outbox.put(None)
                    break
                items.append(more)
            with contextlib.suppress(OSError), self._lock:
                children.send(self.sock, ("notes", items, [], b""))

    # -- receiving ------------------------------------------------------------------------

    def map_new(self, new: list[tuple[object, int]], fds: list[int]) -> None:
        """Map the other side's regions passed with a message (their descriptors ``fds``)."""
        for (key, size), fd in zip(new, fds, strict=True):
            region = Region.mapped(fd, size, key, pin=self._pin)
            self._theirs[key] = region
            self.pool.adopt(region)

    def note(self, items: list[tuple[str, object]], drop: Callable[[object], None]) -> None:
        """The other side's notes: results it let go of (``drop``), regions it closed."""
        for kind, what in items:
            if kind == "drop":
                drop(what)
            elif kind == "forget":
                region = self._theirs.pop(what, None)
                if region is not None:
                    self.pool.disown(region)

    def load(self, data: bytes, held: list[np.ndarray] | None = None, drop: object = None) -> Any:
        """Unpickle what the other side sent. References to our own regions become views of
        the arrays in ``held`` that hold them (else of the region); references to theirs,
        views that, once all are gone, queue ``("drop", drop)`` where ``drop`` is given."""
        return _Unpickler(io.BytesIO(data), self, held or [], drop).load()

    def regions(self) -> dict[str, int]:
        """How many regions of each side this side maps, and how many of them are pinned."""
        theirs = list(self._theirs.values())
        mine = list(self._mine.values())
        return {
            "own": len(mine),
            "own_pinned": sum(r.pinned for r in mine),
            "theirs": len(theirs),
            "theirs_pinned": sum(r.pinned for r in theirs),
        }

    def region(self, key: object) -> Region | None:
        """Ours or theirs, by its key."""
        return self._theirs.get(key) or self._mine.get(key)

    def queue_drop(self, what: object) -> None:
        self._outbox.put(("drop", what))


@dataclass(frozen=True, slots=True)
class _Packed:
    data: bytes
    regions: list[Region]
    own: list[np.ndarray]


class _Pickler(pickle.Pickler):
    """Pickles arrays and memoryviews that lie in a shared region as references."""

    def __init__(self, file: io.BytesIO, wire: _Wire) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._wire = wire
        self.regions: list[Region] = []  # our own regions referenced
        self.own: list[np.ndarray] = []  # the arrays of them referenced

    def persistent_id(self, obj: object) -> object:
        kind = type(obj)
        if kind is memoryview:
            view: memoryview = obj  # type: ignore[assignment]
            if view.nbytes < MIN_SHARED or not view.c_contiguous:
                return ("bytes", view.tobytes())
            ref = self._ref(np.frombuffer(view, np.uint8))
            return ("bytes", view.tobytes()) if ref is None else ("view", *ref)
        if kind is np.ndarray:
            arr: np.ndarray = obj  # type: ignore[assignment]
            if arr.nbytes < MIN_SHARED or not arr.flags.c_contiguous or arr.dtype.hasobject:
                return None
            ref = self._ref(arr)
            return None if ref is None else ("array", *ref, arr.dtype.str, arr.shape)
        return None

    def _ref(self, arr: np.ndarray) -> tuple[object, int, int] | None:
        region = self._wire.pool.find(arr)
        if region is None or region.key is None:
            return None
        if region.key[0] == self._wire.side:  # type: ignore[index]
            if not any(r is region for r in self.regions):
                self.regions.append(region)
            self.own.append(arr)
        return region.key, arr.ctypes.data - region.start, arr.nbytes


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, wire: _Wire, held: list[np.ndarray], drop: object) -> None:
        super().__init__(file)
        self._wire = wire
        self._held = held
        self._drop = drop
        self._bases: dict[object, np.ndarray] = {}

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == "bytes":
            return memoryview(pid[1])
        key, offset, nbytes = pid[1:4]
        flat = self._bytes(key, offset, nbytes)
        if pid[0] == "view":
            return memoryview(flat)  # type: ignore[arg-type]
        dtype, shape = pid[4:6]
        return flat.view(np.dtype(dtype)).reshape(shape)

    def _bytes(self, key: object, offset: int, nbytes: int) -> np.ndarray:
        region = self._wire.region(key)
        if region is None:
            raise RuntimeError(f"a message names shared memory {key!r} this process does not have")
        address = region.start + offset
        if key[0] == self._wire.side:  # type: ignore[index]
            # Ours: a view of the array we hold that holds it, which keeps it alive.
            for arr in self._held:
                at = address - arr.ctypes.data
                if at >= 0 and at + nbytes <= arr.nbytes:
                    return arr.reshape(-1).view(np.uint8)[at : at + nbytes]
            return region.array[offset : offset + nbytes]
        base = self._bases.get(key)
        if base is None:
            # One array per region and message: its views are the references; once every
            # one is gone, the other side may reuse the memory.
            base = self._bases[key] = np.frombuffer(region.array.data, np.uint8)
            if self._drop is not None:
                weakref.finalize(base, self._wire.queue_drop, self._drop).atexit = False
        return base[offset : offset + nbytes]


# -- the caller's side ----------------------------------------------------------------------


class ProcessEngine:
    """The :class:`~ckptz.engines.base.Engine` protocol for an engine in a child process
    (:func:`start`, then :meth:`open`).

    Its attributes are the child engine's, except ``inline`` (always False: every call
    queues and returns a future). ``place`` is refused: frames decoded in another process
    cannot be handed to this process's GPU (``ckptz.load`` decodes in process).

    :meth:`close` closes the child's engine but keeps the process, its CUDA context and both
    sides' pinned pools for the process's next run on the same device (:func:`open_apart`),
    as the process's own pinned pool is kept in process; :meth:`end` ends it (at exit).
    """

    def __init__(self, child: subprocess.Popen[bytes], sock: socket.socket, want: str) -> None:
        self._child = child
        self._want = want
        self._wire = _Wire(CALLER, sock, pin=False)
        self._numbers = itertools.count()
        self._pending: dict[int, tuple[Future[Any], object, list[np.ndarray]]] = {}
        self._pending_lock = threading.Lock()
        self._opened: Future[dict[str, Any]] = Future()
        self._closing: Future[None] = Future()
        self._stats: Future[dict[str, int]] = Future()
        self._dead: BaseException | None = None
        self._open = False
        self._ended = False
        self._reader = threading.Thread(target=self._receive, name="ckptz-engine-replies", daemon=True)
        self._reader.start()
        self.inline = False

    def open(self, **options: Any) -> ProcessEngine:
        """Open the child's engine (``options``: ``threads``, ``level``, ``codec`` and
        ``memory``, as :func:`~ckptz.engines.open_gpu` takes them) and take its attributes.

        Raises:
            CkptzError: the engine could not open there (its own error), or the process died.
        """
        self._opened, self._closing = Future(), Future()
        if self._dead is not None:
            raise self._dead
        self._wire.send(("open",), options)
        try:
            attrs = self._opened.result()
        except BaseException:
            self.end()
            raise
        self._open = True
        self.device: str = attrs["device"]
        self.restore_ahead: int = attrs["restore_ahead"]
        self.threads: int = attrs["threads"]
        self.frame_size: int = attrs["frame_size"]
        self.largest_frame: int = attrs["largest_frame"]
        self.look_ahead: int = attrs["look_ahead"]
        self.span_bytes: int = attrs["span_bytes"]
        self.hashes: bool = attrs["hashes"]
        self.checks: bool = attrs["checks"]
        self._codec_config: dict[str, dict[str, object]] = attrs["codec_config"]
        self._extras: dict[str, object] = attrs["container_extras"]
        return self

    # -- Engine protocol ------------------------------------------------------------------

    def host_buffer(self, size: int) -> np.ndarray:
        """A buffer in memory the engine's process maps too (and pins)."""
        return self._wire.pool.take(size)

    def free_buffer(self, buf: np.ndarray) -> None:
        """Nothing to do: a buffer goes back to the pool once its last view is gone."""

    def encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> Future[EncodedFrame]:
        return self._call("encode", (stream, data, checksum))

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        return self._call("encode_span", (frames, buffer, leaves))

    def decode(
        self, stream: StreamInfo, chunks: list[StoredChunk], length: int, where: str
    ) -> Future[np.ndarray]:
        return self._call("decode", (stream, chunks, length, where))

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        if place is not None:
            raise ValueError("an engine in another process cannot place frames on this process's GPU")
        # Errors name frames in the child: their names go with the span.
        names = tuple(span.names(k) for k in range(len(span)))
        return self._call("decode_span", (replace(span, names=names.__getitem__), None, keep, check, leaves))

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._wire.send(("flush",))

    def codec_config(self) -> dict[str, dict[str, object]]:
        return self._codec_config

    def container_extras(self) -> dict[str, object]:
        return self._extras

    def close(self) -> None:
        """Let the child finish what is queued and close its engine; keep the process for
        the next run (:func:`open_apart`), or end it if it failed."""
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(OSError):
            self._wire.send(("close",))
        with contextlib.suppress(BaseException):
            self._closing.result()
        if self._dead is not None or self._pending:
            self.end()
            return
        with _started_lock:
            if self._want not in _started:
                _started[self._want] = self
                return
        self.end()

    def end(self) -> None:
        """End the process: told to, then killed after :data:`GRACE_S`."""
        if self._ended:
            return
        self._ended = True
        with contextlib.suppress(OSError):
            self._wire.send(("end",))
        self._reader.join(GRACE_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._child.wait(0 if self._dead else GRACE_S)
        if self._child.poll() is None:
            self._child.kill()
            self._child.wait()
        self._wire.close_outbox()
        with contextlib.suppress(OSError):
            self._wire.sock.close()

    def stats(self) -> dict[str, int]:
        """The engine's process, counted: results it holds for this process (``held``), and
        the regions it maps (``own``: its own, ``theirs``: this process's; each ``_pinned``)."""
        self._stats = Future()
        self._wire.send(("stats",))
        return self._stats.result(GRACE_S)

    def alive(self) -> bool:
        """Whether the process still runs and answers."""
        return self._dead is None and not self._ended and self._child.poll() is None

    def __enter__(self) -> ProcessEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls and replies ----------------------------------------------------------------

    def _call(self, method: str, args: tuple[Any, ...]) -> Future[Any]:
        out: Future[Any] = Future()
        n = next(self._numbers)
        packed = self._wire.pack(args)
        with self._pending_lock:
            if self._dead is not None:
                raise self._dead
            # Held until the result is back: what the engine reads, and what it may give
            # back views of (a span decoded into its own buffer).
            self._pending[n] = (out, args, packed.own)
        try:
            self._wire.send(("call", n, method), packed)
        except BaseException:
            with self._pending_lock:
                self._pending.pop(n, None)
            raise
        return out

    def _receive(self) -> None:
        detail = ""
        try:
            while True:
                fds: list[int] = []
                message = children.receive(self._wire.sock, fds)
                kind = message[0]
                self._wire.map_new(message[-2], fds)
                if kind == "done":
                    self._done(message[1], message[2], message[-1])
                elif kind == "notes":
                    self._wire.note(message[1], lambda _: None)
                elif kind == "opened":
                    self._opened.set_result(self._wire.load(message[-1]))
                elif kind == "failed":
                    self._opened.set_exception(children.rebuild_error(self._wire.load(message[-1])))
                elif kind == "closed":
                    self._closing.set_result(None)
                elif kind == "stats":
                    self._stats.set_result(self._wire.load(message[-1]))
                elif kind == "ended":
                    return
        except (OSError, EOFError) as exc:
            detail = "" if isinstance(exc, EOFError) else str(exc)
        except BaseException as exc:  # a reply this side cannot read: fail what waits
            detail = repr(exc)
        died = EngineDiedError(detail)
        for waiting_on in (self._opened, self._closing):
            if not waiting_on.done():
                waiting_on.set_exception(died)
        with self._pending_lock:
            self._dead = died
            waiting, self._pending = list(self._pending.values()), {}
        for fut, _, _ in waiting:
            if not fut.done():
                fut.set_exception(died)

    def _done(self, n: int, ok: bool, data: bytes) -> None:
        with self._pending_lock:
            fut, _, held = self._pending.pop(n)
        try:
            value = self._wire.load(data, held, n)
        except BaseException as exc:
            fut.set_exception(exc)
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(children.rebuild_error(value))


def start(want: str) -> ProcessEngine:
    """Start an engine's process for device ``want`` (it brings up its CUDA context and
    imports the engine while the caller goes on); :meth:`ProcessEngine.open` opens the
    engine in it. Call it from a thread that outlives the engine (the main thread)."""
    extra = {}
    if trace.PATH is not None:  # its timeline beside the caller's
        extra["CKPTZ_TRACE"] = f"{os.path.abspath(trace.PATH)}.engine"
    with trace.span("start engine process"):
        child, sock = children.spawn("ckptz.engines.process", want, extra=extra)
    return ProcessEngine(child, sock, want)


#: Engine processes with no engine open, by device: started ahead (:func:`prestart`) or
#: kept from an earlier run (:meth:`ProcessEngine.close`).
_started: dict[str, ProcessEngine] = {}
_started_lock = threading.Lock()


def prestart(want: str) -> None:
    """Start the process :func:`open_apart` will open an engine in for ``want``, now (once)."""
    with _started_lock:
        if want not in _started:
            with contextlib.suppress(OSError):
                _started[want] = start(want)


def open_apart(want: str, **options: Any) -> ProcessEngine:
    """An engine for ``want`` in a process of its own (one started ahead or kept from an
    earlier run, else a new one), opened with ``options``."""
    with _started_lock:
        engine = _started.pop(want, None)
    if engine is not None and not engine.alive():  # its starting thread has ended, say
        engine.end()
        engine = None
    return (engine or start(want)).open(**options)


@atexit.register
def end_all() -> None:
    """End every engine process kept (at exit)."""
    with _started_lock:
        kept = list(_started.values())
        _started.clear()
    for engine in kept:
        engine.end()


# -- the engine's side ----------------------------------------------------------------------


def _serve(sock: socket.socket, want: str) -> None:
    """The child's life: open the engine it is asked for, then run calls until closed."""
    from ckptz.engines.gpu import pinned

    on_gpu = want != "cpu"
    if on_gpu:
        from ckptz.devices import warm_context

        warm_context(want)  # the context comes up while the engine's modules load
    wire = _Wire(ENGINE, sock, pin=on_gpu)
    pinned.use_pool(wire.pool)
    held: dict[int, list[np.ndarray]] = {}
    held_lock = threading.Lock()

    def drop(n: object) -> None:
        with held_lock:
            held.pop(n, None)  # type: ignore[call-overload]

    def reply(n: int, fut: Future[Any]) -> None:
        error = fut.exception()
        try:
            packed = wire.pack(fut.result() if error is None else children.portable_error(error))
        except Exception as exc:  # a result pickle cannot take: the call fails with why
            error, packed = exc, wire.pack(children.portable_error(exc))
        if packed.own:  # held until the caller lets go of it
            with held_lock:
                held[n] = packed.own
        with contextlib.suppress(OSError):  # else the caller is gone
            wire.send(("done", n, error is None), packed)

    engine: Engine | None = None
    inline: ThreadPoolExecutor | None = None
    try:
        while True:
            fds: list[int] = []
            try:
                message = children.receive(sock, fds)
            except EOFError:
                return
            wire.map_new(message[-2], fds)
            kind = message[0]
            if kind == "call":
                assert engine is not None
                n, method = message[1], message[2]
                fut = _dispatch(getattr(engine, method), wire.load(message[-1]), inline)
                fut.add_done_callback(functools.partial(reply, n))
            elif kind == "notes":
                wire.note(message[1], drop)
            elif kind == "flush" and engine is not None:
                engine.flush()
            elif kind == "open":
                try:
                    engine = _open(want, **wire.load(message[-1]))
                except BaseException as exc:
                    wire.send(("failed",), children.portable_error(exc))
                    continue
                if engine.inline:
                    inline = ThreadPoolExecutor(engine.threads, thread_name_prefix="ckptz-engine")
                wire.send(("opened",), _attributes(engine))
            elif kind == "close":
                engine, inline = _close(engine, inline)
                wire.send(("closed",))
            elif kind == "end":
                return
            elif kind == "stats":
                with held_lock:
                    counts = {"held": len(held), **wire.regions()}
                wire.send(("stats",), counts)
    finally:
        _close(engine, inline)
        with contextlib.suppress(OSError):
            wire.send(("ended",))
        wire.close_outbox()


def _close(engine: Engine | None, inline: ThreadPoolExecutor | None) -> tuple[None, None]:
    """Finish what is queued and close the engine (of a run; the process stays)."""
    if inline is not None:
        inline.shutdown(wait=True)
    if engine is not None:
        engine.close()
    return None, None


def _dispatch(
    call: Callable[..., Future[Any]], args: tuple[Any, ...], inline: ThreadPoolExecutor | None
) -> Future[Any]:
    """``call(*args)``'s future (on a thread of ``inline``, for an engine that codes in its
    caller's thread); a call that raises gives a failed future."""
    if inline is not None:
        return inline.submit(lambda: call(*args).result())
    try:
        return call(*args)
    except BaseException as exc:
        failed: Future[Any] = Future()
        failed.set_exception(exc)
        return failed


def _open(
    want: str, threads: int | None = None, level: int = 3, codec: str = "auto", memory: int | None = None
) -> Engine:
    """The GPU engine on ``want`` (:func:`~ckptz.engines.open_gpu`, in this process); on
    ``cpu`` the CPU engine, which runs the wire on any machine."""
    from ckptz.engines import open_gpu

    if want == "cpu":
        return CpuEngine(threads, level)
    return open_gpu(want, threads=threads, level=level, codec=codec, memory=memory)


def _attributes(engine: Engine) -> dict[str, Any]:
    names = ("device", "restore_ahead", "threads", "frame_size", "largest_frame", "look_ahead")
    attrs: dict[str, Any] = {name: getattr(engine, name) for name in names}
    attrs.update(
        span_bytes=engine.span_bytes,
        hashes=engine.hashes,
        checks=engine.checks,
        codec_config=engine.codec_config(),
        container_extras=engine.container_extras(),
    )
    return attrs


def main(argv: list[str]) -> None:
    """``python -m ckptz.engines.process FD DEVICE``: an engine's process, on socket ``FD``."""
    # As a pipeline runs (ckptz.pipeline.workers.tuned_interpreter): the engine's threads
    # hold the GIL in short stretches between calls that release it, and a run's many small
    # objects are freed by reference counting.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.disable()
    children.run_child(argv, lambda sock, args: _serve(sock, args[0]))


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = [
    "CALLER",
    "ENGINE",
    "EngineDiedError",
    "ProcessEngine",
    "end_all",
    "open_apart",
    "prestart",
    "start",
]
