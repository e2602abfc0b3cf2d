"""What compression saves: checkpoint stall on given storage, and the monthly cost projection.

Pure arithmetic on measured figures: writing a
checkpoint of ``S`` bytes to storage of bandwidth ``B`` idles every GPU for ``S/B`` seconds;
with compression pipelined with the write it takes ``max(S/B_compress, S/(R·B))``. Restores
are the same with the decompression speed and the read bandwidth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: A month, for the projection: 30 days.
MONTH_MINUTES = 30 * 24 * 60
#: Codecs whose write times differ by less than this are a tie; the tie goes to the
#: portable one (its containers decode on machines without a GPU).
TIE = 0.02


@dataclass(frozen=True, slots=True)
class StorageSpeed:
    """Bandwidth of the storage checkpoints go to, in GB/s (10^9 bytes per second).

    Attributes:
        write_gbps: sequential write bandwidth, including fsync.
        read_gbps: sequential read bandwidth.
        method: how the figures were obtained, in words.
        path: the folder measured, or None for figures given on the command line.
    """

    write_gbps: float
    read_gbps: float
    method: str
    path: str | None = None


@dataclass(frozen=True, slots=True)
class CostModel:
    """The projection's assumptions (the CLI shows these defaults in ``--help``).

    Attributes:
        gpus: GPUs that sit idle while a checkpoint is written (a synchronous save).
        gpu_hour_usd: price of one GPU-hour.
        every_min: minutes between checkpoints.
        storage_usd_tb_month: price of storing one TB (10^12 bytes) for a month.
        keep: checkpoints retained at any time.
    """

    gpus: int = 8
    gpu_hour_usd: float = 2.50
    every_min: float = 30.0
    storage_usd_tb_month: float = 20.0
    keep: int = 5

    @property
    def checkpoints_per_month(self) -> float:
        return MONTH_MINUTES / self.every_min


@dataclass(frozen=True, slots=True)
class CodecTotals:
    """One codec configuration's figures for the whole checkpoint (extrapolated from samples).

    Attributes:
        codec: configuration name (``ckptz-auto``, ``zstd-raw``, ...).
        device: where it runs.
        ckptz: True if ``ckptz compress`` can write it (only those are recommended).
        portable: True if its output decodes on a CPU-only machine.
        bytes: original checkpoint bytes.
        compressed_bytes: expected compressed bytes.
        compress_seconds: time to compress ``bytes``, storage aside.
        decompress_seconds: time to decompress them, storage aside.
    """

    codec: str
    device: str
    ckptz: bool
    portable: bool
    bytes: int
    compressed_bytes: float
    compress_seconds: float
    decompress_seconds: float

    @property
    def ratio(self) -> float:
        return self.bytes / self.compressed_bytes if self.compressed_bytes else float("inf")


@dataclass(frozen=True, slots=True)
class CodecPlan:
    """A codec's checkpoint write and restore on the given storage, and what it saves a month.

    Attributes:
        totals: the figures it is computed from.
        write_seconds: pipelined write, ``max(compress, compressed/B_write)``.
        restore_seconds: pipelined restore, ``max(decompress, compressed/B_read)``.
        stall_saved_seconds: uncompressed write time minus ``write_seconds`` (negative: a loss).
        idle_gpu_hours_month: GPU-hours of idling saved a month.
        idle_usd_month: their price.
        storage_tb_saved: TB saved on the retained checkpoints.
        storage_usd_month: their price a month.
    """

    totals: CodecTotals
    write_seconds: float
    restore_seconds: float
    stall_saved_seconds: float
    idle_gpu_hours_month: float
    idle_usd_month: float
    storage_tb_saved: float
    storage_usd_month: float


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The codec that minimises the checkpoint stall, or None when compression does not pay.

    Attributes:
        codec: the ckptz configuration to use, or None to write uncompressed.
        device: where it runs.
        pays: True if it writes the checkpoint faster than writing it uncompressed.
        baseline_write_seconds: uncompressed write time, ``S/B_write``.
        baseline_restore_seconds: uncompressed read time, ``S/B_read``.
        reason: one or two sentences for the user.
    """

    codec: str | None
    device: str | None
    pays: bool
    baseline_write_seconds: float
    baseline_restore_seconds: float
    reason: str


def plan_codec(totals: CodecTotals, storage: StorageSpeed, cost: CostModel) -> CodecPlan:
    """Write and restore times of one codec on ``storage``, and the monthly savings."""
    packed = totals.compressed_bytes
    write = max(totals.compress_seconds, packed / (storage.write_gbps * 1e9))
    restore = max(totals.decompress_seconds, packed / (storage.read_gbps * 1e9))
    saved = totals.bytes / (storage.write_gbps * 1e9) - write
    hours = cost.checkpoints_per_month * saved * cost.gpus / 3600
    tb = cost.keep * (totals.bytes - packed) / 1e12
    return CodecPlan(
        totals,
        write,
        restore,
        saved,
        hours,
        hours * cost.gpu_hour_usd,
        tb,
        tb * cost.storage_usd_tb_month,
    )


def recommend(plans: Sequence[CodecPlan], checkpoint_bytes: int, storage: StorageSpeed) -> Recommendation:
    """Pick the ckptz configuration with the shortest checkpoint write (ties: portable, faster restore).

    Only configurations ``ckptz compress`` can write are candidates; reference rows are
    there to compare with.
    """
    base_write = checkpoint_bytes / (storage.write_gbps * 1e9)
    base_read = checkpoint_bytes / (storage.read_gbps * 1e9)
    candidates = [p for p in plans if p.totals.ckptz]
    if not candidates:
        return Recommendation(None, None, False, base_write, base_read, "no ckptz configuration was measured")
    fastest = min(p.write_seconds for p in candidates)
    near = [p for p in candidates if p.write_seconds <= fastest * (1 + TIE)]
    best = min(near, key=lambda p: (not p.totals.portable, p.write_seconds, p.restore_seconds))
    t = best.totals
    if best.write_seconds >= base_write:
        return Recommendation(
            None,
            None,
            False,
            base_write,
            base_read,
            f"compression does not pay on {_short(storage.write_gbps)} GB/s storage: writing uncompressed "
            f"takes {_short(base_write)} s, the fastest ckptz codec ({t.codec} on {t.device}, "
            f"{_short(t.bytes / t.compress_seconds / 1e9)} GB/s) {_short(best.write_seconds)} s; "
            f"it would still save {100 * (1 - 1 / t.ratio):.0f}% of the storage",
        )
    bound = (
        "the codec" if t.compress_seconds >= t.compressed_bytes / (storage.write_gbps * 1e9) else "storage"
    )
    return Recommendation(
        t.codec,
        t.device,
        True,
        base_write,
        base_read,
        f"{t.codec} on {t.device}: a checkpoint write takes {_short(best.write_seconds)} s instead of "
        f"{_short(base_write)} s ({_short(best.stall_saved_seconds)} s less stall, bound by {bound}); "
        f"restore {_short(best.restore_seconds)} s instead of {_short(base_read)} s",
    )


def _short(x: float) -> str:
    """Seconds or GB/s for a sentence: up to four significant figures, never in exponent form."""
    if 0 < abs(x) < 0.001:
        return "<0.001"
    return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"
