"""Issue 15's benchmark: the container bytes ``ckptz.safe_open(...).get_tensor(k)`` reads.

One command, on the GPU machine (or ``--small`` on a CPU one, in seconds)::

    PYTHONPATH=. python3 bench/safe_open.py [--size-gb 5] [--random 6]

The target: ``safe_open().get_tensor(k)`` on a 5 GB safetensors container reads at most
2× the tensor's compressed bytes.

1. Generates a safetensors file of ``--size-gb`` GB with the e2e benchmark's generator: a
   Llama-shaped model's bf16 weights and, under ``optimizer.``, its AdamW state after ~1000
   steps in fp32 (master weights ~N(0, 0.02), ``exp_avg`` ~N(0, s) with a log-normal s ~1e-4
   per tensor, ``exp_avg_sq`` from four squared gradients, zero rows for the unseen 5% of
   the vocabulary): 14 bytes per parameter, bf16 and fp32 tensors side by side. It is
   written plain with ``safetensors.torch.save_file`` (the reference) and compressed with
   ``ckptz.save_file`` (``--device``; codec ``auto``, which decodes anywhere).
2. For the smallest, median and largest tensor and ``--random`` others (seeded), opens the
   container with a new ``ckptz.safe_open`` (so no frame is cached from an earlier tensor or
   from the header) and measures ``get_tensor(k)``: its time, and the bytes read from files
   by this process while it runs. Every result is checked bit for bit against
   ``safetensors.safe_open`` of the plain file.
3. Reads every tensor once through one ``safe_open`` (the sweep), for the total read against
   the container's size.

**How bytes are counted.** ckptz reads a container with ``os.pread``/``os.preadv`` on its
file descriptor (``ckptz.pipeline.decoder``; nothing is memory-mapped), so the kernel's
``rchar`` counter in ``/proc/self/io`` sees every byte: it counts what ``read``-family
calls of all the process's threads return, page-cache hits included (so tmpfs and a warm
cache count as a cold disk would). The counter is read with one ``pread`` of a descriptor
held open, and the bytes of that one read (a constant, measured with nothing between two
reads) are subtracted. The reader's own count (``ContainerReader.stats.stored_bytes_read``)
is recorded beside it as a cross-check.

**A tensor's compressed bytes** are the payloads (without their ≤15 bytes of padding) of the
container frames holding any of its bytes, found from the container's index as the reader
finds them; ``ratio`` is bytes read over that. A frame is the unit of decoding (1 or 4 MiB
of one stream), and small tensors share one with their neighbours, so the table also gives
``share``: the bytes read over the tensor's pro-rata part of those payloads (its bytes'
fraction of each frame). A tensor much smaller than a frame has a large ``share`` ratio by
construction, whatever the reader does.

JSON goes to ``$OUT/safe_open.json`` (else ``bench/out/safe_open.json``); a markdown table is
printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GB = 1e9
BYTES_PER_PARAM = 14  # bf16 weight + fp32 master, exp_avg, exp_avg_sq
TARGET = 2.0


class ReadCounter:
    """Bytes this process has read from files (``rchar`` of ``/proc/self/io``).

    ``mark = counter()`` is the count with the counter's own read included (the kernel adds
    it once the read returns); ``counter.since(mark)`` what was read after it.
    """

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/io", os.O_RDONLY)

    def _read(self) -> tuple[int, int]:
        text = os.pread(self._fd, 4096, 0)
        for line in text.decode().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1]), len(text)
        raise RuntimeError("no rchar in /proc/self/io")

    def __call__(self) -> int:
        rchar, own = self._read()
        return rchar + own

    def since(self, mark: int) -> int:
        return self._read()[0] - mark

    def close(self) -> None:
        os.close(self._fd)


def make_tensors(nbytes: int, device: str, seed: int) -> dict[str, Any]:
    """bf16 weights and fp32 AdamW state of a Llama-shaped model of ``nbytes`` (on the CPU)."""
    import torch
    from e2e import _dims, _optimizer_state, _shapes  # the e2e benchmark's generator

    dims = _dims(nbytes, BYTES_PER_PARAM)
    gen = torch.Generator(device=device).manual_seed(seed)
    state, weights = _optimizer_state(dims, gen, device)
    tensors: dict[str, Any] = dict(weights)
    for i, (name, _) in enumerate(_shapes(dims)):
        for key in ("master_weight", "exp_avg", "exp_avg_sq"):
            tensors[f"optimizer.{name}.{key}"] = state["state"][i].pop(key)
    return tensors


def frame_payloads(path: Path) -> tuple[list[Any], list[int]]:
    """The container's frames, numbered as ``ContainerReader.frames_over`` numbers them
    (:func:`ckptz.pipeline.plan.frame_map` of its index), and each one's payload bytes."""
    from ckptz.container import frame_chunk_starts, read_index, stream_frame_lists
    from ckptz.pipeline.plan import frame_map

    with path.open("rb") as f:
        index = read_index(f, str(path))
    segments = zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True)
    frames = frame_map(list(segments), [s.frame_size for s in index.streams])
    rows = stream_frame_lists(index)
    starts = frame_chunk_starts(index.frames)
    sizes = index.chunks["size"].astype("int64")
    payloads = []
    for frame in frames:
        row = int(rows[frame.stream][frame.number])
        first = int(starts[row])
        payloads.append(int(sizes[first : first + int(index.frames[row]["chunks"])].sum()))
    return frames, payloads


def share(begin: int, end: int, frames: list[Any], payloads: list[int]) -> float:
    """The pro-rata part of ``frames``' payloads that original bytes ``[begin, end)`` account for."""
    total = 0.0
    for frame, payload in zip(frames, payloads, strict=True):
        inside = sum(max(0, min(end, at + n) - max(begin, at)) for at, _, n in frame.pieces)
        total += payload * inside / frame.length
    return total


def pick(sizes: dict[str, int], extra: int, seed: int) -> dict[str, str]:
    """The smallest, median and largest tensor, and ``extra`` others at random: key → role."""
    order = sorted(sizes, key=lambda k: (sizes[k], k))
    roles = {order[0]: "smallest", order[len(order) // 2]: "median", order[-1]: "largest"}
    rest = [k for k in order if k not in roles]
    for k in random.Random(seed).sample(rest, min(extra, len(rest))):
        roles[k] = "random"
    return roles


def bitwise_equal(a: Any, b: Any) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def measure(container: Path, plain: Path, roles: dict[str, str], count: ReadCounter) -> list[dict[str, Any]]:
    """``get_tensor`` of each key in a new ``ckptz.safe_open``, against safetensors'."""
    import safetensors

    import ckptz
    from ckptz.library.safetensors_header import read_header

    with plain.open("rb") as f:  # the container restores to these bytes: the same offsets
        header = read_header(f, plain.stat().st_size, str(plain))
    frames, payloads = frame_payloads(container)
    rows = []
    with safetensors.safe_open(str(plain), "pt") as ref:
        for key, role in roles.items():
            info = header.tensors[key]
            start, mark = time.perf_counter(), count()
            with ckptz.safe_open(container) as f:
                opening, open_s = count.since(mark), time.perf_counter() - start
                reader = f.file
                assert isinstance(reader, ckptz.ContainerReader)
                start, stats, mark = time.perf_counter(), reader.stats, count()
                got = f.get_tensor(key)
                seconds = time.perf_counter() - start
                read = count.since(mark)
                counted = reader.stats.stored_bytes_read - stats.stored_bytes_read
                held = reader.frames_over(info.begin, info.end - info.begin)
            start = time.perf_counter()
            want = ref.get_tensor(key)
            reference_s = time.perf_counter() - start
            compressed = sum(payloads[i] for i in held)
            part = share(info.begin, info.end, [frames[i] for i in held], [payloads[i] for i in held])
            rows.append(
                {
                    "key": key,
                    "role": role,
                    "dtype": info.dtype,
                    "shape": list(info.shape),
                    "bytes": info.end - info.begin,
                    "frames": len(held),
                    "compressed_bytes": compressed,
                    "share_bytes": part,
                    "bytes_read": read,
                    "reader_bytes_read": counted,
                    "open_bytes_read": opening,
                    "open_seconds": open_s,
                    "ratio": read / compressed if compressed else None,
                    "share_ratio": read / part if part else None,
                    "seconds": seconds,
                    "safetensors_seconds": reference_s,
                    "equal": bitwise_equal(got, want),
                }
            )
    return rows


def sweep(container: Path, count: ReadCounter) -> dict[str, Any]:
    """Every tensor once, in key order, through one ``safe_open``."""
    import ckptz

    start, mark = time.perf_counter(), count()
    with ckptz.safe_open(container) as f:
        keys = f.keys()
        for key in keys:
            f.get_tensor(key)
    return {"tensors": len(keys), "bytes_read": count.since(mark), "seconds": time.perf_counter() - start}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=5.0)
    ap.add_argument("--small", action="store_true", help="0.03 GB on the CPU")
    ap.add_argument("--random", type=int, default=6, help="random tensors measured besides three")
    ap.add_argument("--device", default=None, help="where to generate and compress (default: cuda if any)")
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm/ckptz-safe-open"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sweep", action="store_true", help="skip reading every tensor once")
    ap.add_argument("--keep", action="store_true", help="leave the files in --dir")
    ap.add_argument("--json", type=Path, default=None, help="default: $OUT/safe_open.json")
    a = ap.parse_args(argv)
    import safetensors
    import torch
    from safetensors.torch import save_file

    import ckptz

    device = a.device or ("cuda" if torch.cuda.is_available() and not a.small else "cpu")
    size = 0.03 if a.small else a.size_gb
    a.dir.mkdir(parents=True, exist_ok=True)
    plain, container = a.dir / "model.safetensors", a.dir / "model.safetensors.ckptz"
    count = ReadCounter()
    try:
        start = time.perf_counter()
        tensors = make_tensors(int(size * GB), device.split(":")[0], a.seed)
        generate_s = time.perf_counter() - start
        save_file(tensors, str(plain), metadata={"format": "pt"})
        start = time.perf_counter()
        ckptz.save_file(tensors, container, metadata={"format": "pt"}, device=device)
        save_s = time.perf_counter() - start
        sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
        del tensors
        roles = pick(sizes, a.random, a.seed)
        rows = measure(container, plain, roles, count)
        swept = None if a.no_sweep else sweep(container, count)
        doc: dict[str, Any] = {
            "device": device,
            "host": platform.node(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "safetensors": safetensors.__version__,
            "size_gb": size,
            "tensors": len(sizes),
            "plain_bytes": plain.stat().st_size,
            "container_bytes": container.stat().st_size,
            "generate_seconds": generate_s,
            "ckptz_save_file_seconds": save_s,
            "target_ratio": TARGET,
            "rows": rows,
            "sweep": swept,
        }
    finally:
        count.close()
        if not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)
    out = a.json or Path(os.environ.get("OUT") or Path(__file__).parent / "out") / "safe_open.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    report(doc)
    ok = all(r["equal"] for r in rows)
    return 0 if ok else 1


def report(doc: dict[str, Any]) -> None:
    rows = doc["rows"]
    print(
        f"\n## safe_open().get_tensor(k): {doc['plain_bytes'] / GB:.2f} GB safetensors, "
        f"container {doc['container_bytes'] / GB:.2f} GB ({doc['tensors']} tensors, compressed on {doc['device']})"
    )
    print(
        "| tensor | dtype | MB | frames | compressed MB | read MB | ratio | share ratio | ms | safetensors ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        share = f"{r['share_ratio']:.2f}" if r["share_ratio"] is not None else "-"
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        print(
            f"| {r['role']}: `{r['key']}` | {r['dtype']} | {r['bytes'] / 1e6:.3f} | {r['frames']} "
            f"| {r['compressed_bytes'] / 1e6:.3f} | {r['bytes_read'] / 1e6:.3f} | {ratio} | {share} "
            f"| {r['seconds'] * 1e3:.1f} | {r['safetensors_seconds'] * 1e3:.1f} |"
        )
    worst = max((r["ratio"] for r in rows if r["ratio"] is not None), default=float("nan"))
    opened = statistics.median(r["open_bytes_read"] for r in rows)
    open_ms = statistics.median(r["open_seconds"] for r in rows) * 1e3
    print(
        f"worst ratio {worst:.3f} (target ≤ {TARGET:g}); each safe_open reads {opened / 1e6:.3f} MB "
        f"more (index, header) in {open_ms:.1f} ms; every tensor equal to safetensors': "
        f"{all(r['equal'] for r in rows)}"
    )
    if doc["sweep"]:
        s = doc["sweep"]
        print(
            f"every tensor through one safe_open: read {s['bytes_read'] / GB:.3f} GB "
            f"({s['bytes_read'] / doc['container_bytes']:.3f}× the container) in {s['seconds']:.2f} s"
        )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
