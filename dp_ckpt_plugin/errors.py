"""Errors raised to users.

Every error carries a message meant to be read by a person: it names the key
or path involved and what is wrong with it. Command-line entry points print the
message and exit non-zero instead of showing a traceback.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class of every error dp_ckpt_plugin raises on purpose.

    ``said`` is true once the error's line was logged where it was found (a
    background thread: the lease's heartbeat, the uploader); a front that
    catches it later ends with it without saying it again.
    """

    said: bool = False


class ConfigError(CheckpointError, ValueError):
    """A configuration value is missing, of the wrong type or unusable."""


class CheckpointWriteError(CheckpointError, OSError):
    """Writing, committing or publishing a checkpoint failed.

    The previous checkpoint, pointer and alias are left as they were.
    """


class StoreLockedError(CheckpointError):
    """Another live process is writing the same checkpoint directory."""


class RestartNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint could be resolved from a restart specification."""


class UnsafePointerError(CheckpointError):
    """A pointer or alias leads outside the directory that holds it."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint does not match its commit record or cannot be read."""


class UnreadableFileError(CheckpointError):
    """A file the store reads is not one it can read: a FIFO, a device, a
    socket, a directory or a link where a file is expected, one too large,
    or one the operating system refuses to read.

    Attributes
    ----------
    path : Path
        The file.
    reason : str
        What it is instead, or the cause (``is a FIFO, not a file``).
    """

    def __init__(self, path, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason


class InvalidRecordError(CheckpointError):
    """A commit record is malformed, too new, or disagrees with its file.

    A record is evidence: such a record means "not committed". The file beside
    it is skipped, never moved aside (it may be perfectly good).
    """


class ForkedError(CheckpointError):
    """A store used in a forked child of the process that built it.

    The child has the store's memory without its threads: it builds its own.
    """


def describe_os_error(exc: BaseException) -> str:
    """Return a short cause for an OS error, such as ``No space left on device``.

    Parameters
    ----------
    exc : BaseException
        The error to describe.

    Returns
    -------
    str
        ``strerror`` when the error has one, else its text.
    """
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
