"""Every exception ckptz raises on purpose.

Each error subclasses both :class:`CkptzError` and the builtin it resembles, carries
the fields that locate the problem (path, chunk, codec) and ends its message with what
to do next. The CLI maps them to one line on stderr and an exit code; anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


class CkptzError(Exception):
    """Base of every error ckptz raises on purpose.

    Attributes:
        path: the file the error is about, if any.
        hint: what the user can do next.
    """

    exit_code = 1

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.path = path
        self.hint = hint
        self.message = message
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} ({self.hint})" if self.hint else text


class UsageError(CkptzError, ValueError):
    """The command line or API call asks for something impossible."""

    exit_code = 2


class InputNotFoundError(CkptzError, FileNotFoundError):
    """A source path does not exist."""


class UnsafePathError(CkptzError, PermissionError):
    """A path would escape its folder (symlink or `..`), so ckptz refuses it."""


class FormatError(CkptzError, ValueError):
    """A checkpoint file claims a structure it does not have (truncated, hostile sizes)."""


class ContainerError(CkptzError, ValueError):
    """A `.ckptz` container is unreadable: bad magic, unknown version, broken tables."""


class UnsupportedVersionError(ContainerError):
    """The container was written by a newer, incompatible ckptz."""


class CorruptionError(ContainerError):
    """Stored bytes do not match their checksum.

    Attributes:
        chunk: index of the chunk (or frame) whose check failed, if known.
        tensor: a key path of a tensor stored in that chunk, if known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        chunk: int | None = None,
        tensor: str | None = None,
        hint: str | None = "the container is damaged; restore it from another copy",
    ) -> None:
        self.chunk = chunk
        self.tensor = tensor
        #: the message without the location suffix, so a caller can re-raise with more location.
        self.reason = message
        if tensor:  # the chunk index means nothing to a user; the tensor's name does
            message = f"{message} (in tensor {tensor})"
        super().__init__(message, path=path, hint=hint)


class ReferenceMissingError(ContainerError):
    """A series container's reference (the newer checkpoint it is coded against) is gone.

    Attributes:
        reference: the reference's path, as the container names it.
    """

    def __init__(self, message: str, *, reference: str, path: str | None = None, hint: str | None = None):
        self.reference = reference
        super().__init__(message, path=path, hint=hint)


class ReferenceChangedError(ReferenceMissingError):
    """A series container's reference exists but is not the file it was coded against."""


class ReferenceDamagedError(ReferenceChangedError, CorruptionError):
    """A series container's reference is there but fails its own checks (its bytes are
    damaged): the container that names it may be intact, and restores once the reference is."""


class MismatchError(CkptzError, ValueError):
    """A restored file differs from the original it is compared against."""


class SourceChangedError(CkptzError, RuntimeError):
    """A file an in-place run read changed (rewritten, replaced, touched) before the run
    replaced it: the file is kept as it is now and the form made from its old bytes removed.

    Attributes:
        changed: the files that changed (relative paths).
    """

    def __init__(self, changed: tuple[str, ...], *, replaces: str = "compress") -> None:
        self.changed = changed
        names = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        one = len(changed) == 1
        super().__init__(
            "changed during the run: kept as it is now, nothing made from its old bytes"
            if one
            else f"{len(changed)} files changed during the run: {names}; kept as they are now",
            path=changed[0] if one else None,
            hint=f"run the same command again to {replaces} the new bytes",
        )


class NameTakenError(SourceChangedError):
    """Another program made a file under the name an in-place run was about to give its
    output (a trainer saving ``X`` while ``X.ckptz`` is restored): both files are kept and
    nothing is renamed over the newcomer."""

    def __init__(self, label: str, name: str) -> None:
        self.changed = (label,)
        self.name = name
        CkptzError.__init__(
            self,
            f"{name} appeared beside it during the run (another program wrote it): both kept, nothing replaced",
            path=label,
            hint="keep the one you want, move the other away, then run the same command again",
        )

    def __reduce__(self) -> tuple[type[NameTakenError], tuple[str, str]]:
        return type(self), (self.changed[0], self.name)  # pickled (between processes) as it was made


class CodecError(CkptzError, RuntimeError):
    """A codec failed to encode or decode.

    Attributes:
        codec: the codec's name.
    """

    def __init__(self, message: str, *, codec: str, path: str | None = None, hint: str | None = None):
        self.codec = codec
        super().__init__(f"codec {codec}: {message}", path=path, hint=hint)


class CodecUnavailableError(CodecError):
    """A codec needed to decode (or asked for) cannot run on this machine, e.g. GPU-only ANS."""


class DeviceError(CkptzError, RuntimeError):
    """The requested device cannot be used (no GPU, no nvCOMP, bad index)."""


class OutOfSpaceError(CkptzError, OSError):
    """Writing failed because the disk is full or the quota exceeded."""


class OutOfMemoryError(CkptzError, MemoryError):
    """A file too large to decode into this process's memory (load it mapped instead)."""


class WriteError(CkptzError, OSError):
    """Writing failed for another OS reason (permissions, read-only filesystem)."""


class UnreadableError(CkptzError, PermissionError):
    """Files a run needs cannot be read; nothing was done.

    Attributes:
        files: ``(path, why)`` of each.
    """

    def __init__(self, files: tuple[tuple[str, str], ...]) -> None:
        self.files = files
        n = len(files)
        super().__init__(
            f"{n} file{'s' * (n != 1)} cannot be read; nothing was done",
            path=files[0][0] if n == 1 else None,
            hint="give this user read access, or pass --skip-unreadable to leave them out",
        )

    def __reduce__(self) -> tuple[type[UnreadableError], tuple[tuple[tuple[str, str], ...]]]:
        return type(self), (self.files,)  # pickled (between processes) as it was made


class NothingToDoError(CkptzError, FileNotFoundError):
    """The sources hold nothing the command could work on (no checkpoint, no container, no match)."""


class BusyError(CkptzError, BlockingIOError):
    """Another ckptz run holds a lock on the same files or folder."""


class StoppedError(CkptzError, RuntimeError):
    """The run was stopped by Ctrl-C or SIGTERM; finished files are complete, the others untouched.

    Not an ``InterruptedError``: that is an ``OSError``, which write paths turn into
    :class:`WriteError`.

    Attributes:
        finished: the files completed before the stop (relative paths).
        remaining: how many files were not finished.
    """

    exit_code = 130

    def __init__(self, finished: tuple[str, ...] = (), remaining: int = 0) -> None:
        self.finished = finished
        self.remaining = remaining
        names = ", ".join(finished[:5]) + (f" and {len(finished) - 5} more" if len(finished) > 5 else "")
        done = f"{len(finished)} file{'s' * (len(finished) != 1)} finished" + (f" ({names})" if names else "")
        super().__init__(
            f"stopped: {done}; {remaining} left as they were",
            hint="run the same command again to finish",
        )


class DistributedError(CkptzError, RuntimeError):
    """Ranks started by ``torchrun`` cannot work together (no gloo, lost contact, different files)."""


class PeerFailedError(CkptzError, RuntimeError):
    """Another rank of a ``torchrun`` run failed, so this one stopped; the exit code is that rank's.

    Attributes:
        rank: the rank that failed.
        quiet: rank 0 reports the failure; the other ranks only exit with its code.
    """

    def __init__(self, rank: int, message: str, exit_code: int = 1, *, quiet: bool = False) -> None:
        self.rank = rank
        self.exit_code = exit_code
        self.quiet = quiet
        super().__init__(f"rank {rank} failed: {message}")
