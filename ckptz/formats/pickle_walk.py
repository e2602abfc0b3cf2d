"""Read a torch pickle (``data.pkl``, a legacy object pickle) without importing or executing anything.

The C :class:`pickle.Unpickler` does the parsing, but its ``find_class`` never imports: every
global becomes an inert *stub type* that only records the arguments it is called with. A
``__reduce__`` naming ``os.system`` therefore builds a stub and runs nothing. Persistent ids
(torch's storage references) become :class:`StorageRef` values. The resulting object tree is then
walked iteratively to find tensors: calls of ``torch._utils._rebuild_tensor_v2``/``_v3``/
``_rebuild_qtensor`` whose first argument is a storage, plus wrappers (``_rebuild_parameter``,
``_rebuild_from_type_v2``, DTensor's ``_local_tensor``) that are unwrapped on the way.

Resources are bounded before the C unpickler runs: the pickle's size is capped, and a pass over
its opcodes with :func:`pickletools.genops` rejects memo indices larger than the pickle itself
(CPython sizes its memo array by the largest index, so ``LONG_BINPUT 0xFFFFFFF0`` would allocate
tens of GiB) and absurd opcode counts.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickle
import pickletools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ckptz.codecs.native import native
from ckptz.dtypes import DTYPES, STORAGE_TYPES
from ckptz.errors import FormatError

MAX_PICKLE_BYTES = 256 << 20
"""Largest pickle ckptz walks; a real ``data.pkl`` is a few MiB even for very large models, and
an unpickled object graph can be tens of times larger than its pickle."""

MAX_OPCODES = 50_000_000

_MAX_PATH = 1024
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_TENSOR_REBUILDS = frozenset(
    {
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_tensor_v3",
        "torch._utils._rebuild_qtensor",
    }
)
_TEXT_PID = re.compile(r"\('storage', <class '([\w.]+)'>, '(\w+)', '([^']*)', (\d{1,19})(?:, None)?\)")
_TEXT_CODECS = frozenset({"latin1", "latin-1", "iso-8859-1", "utf-8", "utf8", "ascii"})


@dataclass(frozen=True, slots=True)
class StorageRef:
    """A storage as named by a persistent id ``('storage', type, key, location, numel[, view])``.

    Attributes:
        key: the storage key (``data/<key>`` in a zip; a pointer value in legacy files).
        type_name: the storage class, e.g. ``torch.FloatStorage`` or ``torch.UntypedStorage``.
        location: device tag as saved (``cpu``, ``cuda:0``); informational only.
        numel: element count in units of the storage type (bytes for untyped storages).
    """

    key: str
    type_name: str
    location: str
    numel: int

    @property
    def dtype(self) -> str:
        """The dtype the storage type implies (``uint8`` for untyped or unknown storages)."""
        return STORAGE_TYPES.get(self.type_name.rsplit(".", 1)[-1], "uint8")

    @property
    def typed(self) -> bool:
        """Whether the storage type names a dtype (untyped storages get theirs from tensors)."""
        name = self.type_name.rsplit(".", 1)[-1]
        return name in STORAGE_TYPES and name != "UntypedStorage"


@dataclass(frozen=True, slots=True)
class TensorRecord:
    """One reference to a storage found in the object tree.

    Attributes:
        path: key path joined with ``.`` (``state.3.exp_avg``); empty for the root object.
        key: storage key.
        dtype: dtype name the tensor views the storage as.
        offset: storage offset in elements of ``dtype``.
        shape: tensor shape (``(numel,)`` for a bare storage).
        stride: tensor stride.
    """

    path: str
    key: str
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class PickleScan:
    """What walking one pickle found.

    Attributes:
        storages: every storage the pickle names, by key, in first-encounter order.
        tensors: every tensor (or bare storage) reference, in walk order.
    """

    storages: dict[str, StorageRef]
    tensors: tuple[TensorRecord, ...]

    def paths(self, key: str) -> tuple[str, ...]:
        """Key paths that reach storage ``key``, deduplicated, in walk order."""
        return tuple(dict.fromkeys(t.path for t in self._by_key.get(key, ())))

    @cached_property
    def _by_key(self) -> dict[str, list[TensorRecord]]:
        """The tensors viewing each storage, in walk order (found once: asking each storage
        in turn to look through every tensor took quadratic time on a large optimizer)."""
        by_key: dict[str, list[TensorRecord]] = {}
        for t in self.tensors:
            by_key.setdefault(t.key, []).append(t)
        return by_key

    def dtype(self, key: str) -> str:
        """The dtype to treat storage ``key``'s bytes as.

        A typed storage's own dtype wins; an untyped one takes the dtype of the tensors viewing
        it when they agree, and is raw bytes otherwise.
        """
        ref = self.storages.get(key)
        if ref is not None and ref.typed:
            return ref.dtype
        seen = {t.dtype for t in self._by_key.get(key, ())}
        return seen.pop() if len(seen) == 1 else "uint8"


class Stub:
    """Base of the inert types that stand in for every global a pickle names."""

    qualname = "?"
    args: tuple[Any, ...]
    kw: dict[str, Any]
    state: Any
    items: list[Any]
    setitems: list[tuple[Any, Any]]


class ODict(dict[Any, Any]):
    """``collections.OrderedDict`` stand-in; state dicts BUILD a ``_metadata`` attribute onto it."""


def _stub_new(cls: type[Stub], *args: Any, **kw: Any) -> Stub:
    obj = object.__new__(cls)
    obj.args, obj.kw, obj.state, obj.items, obj.setitems = args, kw, None, [], []
    return obj


def _make_stub(qualname: str) -> type[Stub]:
    return type(
        qualname.rsplit(".", 1)[-1],
        (Stub,),
        {
            "__new__": _stub_new,
            "__init__": lambda self, *a, **k: None,
            "__setstate__": lambda self, st: setattr(self, "state", st),
            "__setitem__": lambda self, k, v: self.setitems.append((k, v)),
            "append": lambda self, v: self.items.append(v),
            "extend": lambda self, v: self.items.extend(v),
            "qualname": qualname,
        },
    )


def _encode(text: Any = "", encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes; only plain text codecs."""
    if not isinstance(text, str) or encoding.lower() not in _TEXT_CODECS:
        raise pickle.UnpicklingError(f"refusing _codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode(encoding)


class _StubUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="latin1")
        self.storages: dict[str, StorageRef] = {}
        # Per instance, so names from a hostile file do not accumulate across files.
        self._stubs: dict[str, type[Stub]] = {}

    def stub(self, qualname: str) -> type[Stub]:
        if qualname not in self._stubs:
            self._stubs[qualname] = _make_stub(qualname)
        return self._stubs[qualname]

    def find_class(self, module: str, name: str) -> Any:
        # Protocol < 3 pickles carry Python 2 names; normalise them as torch does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if (module, name) == ("collections", "OrderedDict"):
            return ODict
        if (module, name) == ("_codecs", "encode"):
            return _encode
        return self.stub(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, str) and (m := _TEXT_PID.fullmatch(pid)):
            # Protocol 0 stores the persistent id as the tuple's repr (torch itself cannot load it).
            stype, key, location, numel = m.groups()
            pid = ("storage", self.stub(stype), key, location, int(numel))
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            _, stype, key, location, numel = pid[:5]
            if not isinstance(numel, int) or numel < 0:
                raise pickle.UnpicklingError(f"storage {key!r} has a bad element count {numel!r}")
            key = str(key)
            if key not in self.storages:
                tname = stype.qualname if isinstance(stype, type) and issubclass(stype, Stub) else str(stype)
                self.storages[key] = StorageRef(key, tname, str(location), numel)
            return self.storages[key]
        # ('module', cls, source_file, source) in legacy files, or anything else: inert.
        return _stub_new(self.stub("<persistent>"), pid)


def _opcode_kinds() -> bytes:
    """What each opcode's argument is, for the native pass (``pickle_ops.c``'s table),
    from pickletools' own descriptors."""
    fixed = {1: 2, 2: 3, 4: 4, 8: 5}
    lengths = {
        pickletools.TAKEN_FROM_ARGUMENT1: 9,
        pickletools.TAKEN_FROM_ARGUMENT4: 10,
        pickletools.TAKEN_FROM_ARGUMENT4U: 11,
        pickletools.TAKEN_FROM_ARGUMENT8U: 12,
    }
    lines = {"stringnl_noescape": 6, "stringnl_noescape_pair": 7}
    kinds = bytearray(256)
    for op in pickletools.opcodes:
        arg = op.arg
        if arg is None:
            kind = 1
        elif arg.n == pickletools.UP_TO_NEWLINE:
            kind = lines.get(arg.name, 8)
        else:
            kind = fixed.get(arg.n) or lengths.get(arg.n, 0)
        flags = 0x10 * (op.name in _MEMO_PUTS) | 0x20 * (op.name == "PROTO") | 0x40 * (op.name == "STOP")
        flags |= 0x80 * arg.name.startswith("unicodestring") if arg is not None else 0
        kinds[ord(op.code.encode("latin1"))] = kind | flags
    return bytes(kinds)


_KINDS = _opcode_kinds()


def _opcodes_fine(data: bytes) -> bool:
    """Whether the native pass walked ``data`` to its STOP within every limit (False also
    where it is unsure: :func:`_check_opcodes` then decides)."""
    scan = native.pickle_scan(data, _KINDS)
    if scan is None:
        return False
    count, max_put, max_proto = scan
    return count <= MAX_OPCODES and max_put <= len(data) and max_proto <= pickle.HIGHEST_PROTOCOL


def _check_opcodes(data: bytes) -> None:
    """Reject pickles whose memo or opcode count would make the C unpickler allocate absurdly.

    A pickle the native pass finds fine is fine; any other is walked with
    :func:`pickletools.genops`, whose errors are the ones raised (a pickle of 712 tensors:
    6 ms walked, 0.05 ms native)."""
    if _opcodes_fine(data):
        return
    limit = len(data)
    for count, (opcode, arg, _) in enumerate(pickletools.genops(data)):
        if count >= MAX_OPCODES:
            raise FormatError(f"pickle has more opcodes than ckptz walks ({MAX_OPCODES})")
        if opcode.name in _MEMO_PUTS and (not isinstance(arg, int) or arg < 0 or arg > limit):
            raise FormatError(f"pickle memo index {arg!r} exceeds the pickle's size")
        if opcode.name == "PROTO" and not (isinstance(arg, int) and 0 <= arg <= pickle.HIGHEST_PROTOCOL):
            raise FormatError(f"unsupported pickle protocol {arg}")


def _segment(key: Any) -> str:
    """A dict key as one path segment."""
    if isinstance(key, str):
        return key
    if isinstance(key, bytes):
        return key.decode("latin1")
    if isinstance(key, type) and issubclass(key, Stub):
        return key.qualname
    if isinstance(key, Stub):
        return type(key).qualname
    if isinstance(key, tuple):
        return "(" + ",".join(_segment(k) for k in key) + ")"
    return str(key) if isinstance(key, int | float | bool | type(None)) else type(key).__name__


def _join(path: str, seg: str) -> str:
    # Paths stop growing past _MAX_PATH so that hostile nesting costs linear, not quadratic, time.
    if len(path) > _MAX_PATH:
        return path
    return f"{path}.{seg}" if path else seg


def _ints(value: Any) -> tuple[int, ...]:
    if isinstance(value, Stub) and value.args:  # torch.Size((2, 3))
        value = value.args[0]
    if isinstance(value, tuple | list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return ()


def _tensor_record(path: str, stub: Stub, storage: StorageRef) -> TensorRecord:
    args = stub.args
    dtype = storage.dtype
    if type(stub).qualname.endswith("_v3") and len(args) > 6:
        dt = args[6]
        if isinstance(dt, type) and issubclass(dt, Stub):
            name = dt.qualname.removeprefix("torch.")
            dtype = name if name in DTYPES else "uint8"
    offset = args[1] if len(args) > 1 and isinstance(args[1], int) else 0
    shape = _ints(args[2]) if len(args) > 2 else ()
    stride = _ints(args[3]) if len(args) > 3 else ()
    return TensorRecord(path, storage.key, dtype, offset, shape, stride)


def _children(obj: Any, path: str) -> Iterator[tuple[Any, str]]:
    """The objects below ``obj`` with their paths, in the order a reader would expect."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield v, _join(path, _segment(k))
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield v, _join(path, str(i))
    elif isinstance(obj, set | frozenset):
        # Set order is not reproducible, so members share the set's path.
        for v in obj:
            yield v, path
    elif isinstance(obj, Stub):
        # Constructor arguments and state are not a level a user would name.
        for a in obj.args:
            yield from _flat(a, path)
        yield from _flat(obj.kw, path)
        yield from _flat(obj.state, path)
        for i, v in enumerate(obj.items):
            yield v, _join(path, str(i))
        for k, v in obj.setitems:
            yield v, _join(path, _segment(k))


def _flat(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    """``value`` at ``path``; a ``(dict, slots)`` state tuple is unpacked without index segments."""
    if isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, dict | None) for v in value):
        yield from ((v, path) for v in value if v is not None)
    elif value is not None:
        yield value, path


_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type, type(None))


def _walk(root: Any, storages: dict[str, StorageRef], budget: int) -> list[TensorRecord]:
    records: list[TensorRecord] = []
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        obj, path = stack.pop()
        budget -= 1
        if budget < 0:
            raise FormatError("pickle object graph is too large to walk")
        if isinstance(obj, _LEAVES):
            continue
        if isinstance(obj, StorageRef):
            records.append(TensorRecord(path, obj.key, obj.dtype, 0, (obj.numel,), (1,)))
            continue
        if isinstance(obj, Stub):
            qual = type(obj).qualname
            if qual in _TENSOR_REBUILDS and obj.args and isinstance(obj.args[0], StorageRef):
                # Tensors are recorded on every path that reaches them (tied weights).
                records.append(_tensor_record(path, obj, obj.args[0]))
                if qual.endswith("_qtensor") and len(obj.args) > 4:
                    stack.append((obj.args[4], _join(path, "quantizer")))
                continue
            if qual == "torch._utils._rebuild_from_type_v2" and len(obj.args) >= 4:
                func, _, fargs, state = obj.args[:4]
                if isinstance(func, type) and issubclass(func, Stub) and isinstance(fargs, tuple):
                    stack.extend(reversed([*_flat(state, path), (func(*fargs), path)]))
                    continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        stack.extend(reversed(list(_children(obj, path))))
    return records


def scan_pickle(data: bytes) -> PickleScan:
    """Find every storage and tensor reference in a torch pickle, without executing it.

    Args:
        data: the pickle bytes (``data.pkl`` of a torch zip, or a legacy object pickle).

    Returns:
        The storages and the tensor records that reference them.

    Raises:
        FormatError: the pickle is too large, malformed, or hostile.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise FormatError(f"pickle of {len(data)} bytes is larger than ckptz walks ({MAX_PICKLE_BYTES})")
    try:
        _check_opcodes(data)
        unpickler = _StubUnpickler(data)
        root = unpickler.load()
    except FormatError:
        raise
    except Exception as exc:  # any parse failure of untrusted bytes, MemoryError included
        raise FormatError(f"pickle cannot be read safely: {type(exc).__name__}: {exc}") from None
    records = _walk(root, unpickler.storages, 8 * len(data) + 1024)
    return PickleScan(unpickler.storages, tuple(records))


def load_stub(data: bytes) -> Any:
    """Unpickle ``data`` into inert stubs (for small side files such as DCP ``.metadata``).

    Raises:
        FormatError: as :func:`scan_pickle`.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise FormatError(f"pickle of {len(data)} bytes is larger than ckptz reads")
    try:
        _check_opcodes(data)
        return _StubUnpickler(data).load()
    except FormatError:
        raise
    except Exception as exc:
        raise FormatError(f"pickle cannot be read safely: {type(exc).__name__}: {exc}") from None
