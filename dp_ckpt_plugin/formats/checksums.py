"""What a checkpoint file carries to check itself, for one without a commit record.

A commit record names a checkpoint's size and digest. A file without one
(plain deepmd-kit's, or a hard link of a checkpoint into another directory,
as dflow-based tools hand a model to the next iteration) is checked by what
its own format carries, over the bytes the storage read once (the bytes every
loader is then served, never the path again):

- a zip archive (``torch.save``'s format, TorchScript's too): the CRC32 of
  every member, each member read to its end (Python's ``zipfile`` compares the
  CRC32 there), and the names of the central directory against the local
  headers;
- an HDF5 file: every dataset read back, which checks the fletcher32
  checksum of each dataset that has one (HDF5 carries no checksum of the
  rest);
- a legacy torch pickle (``_use_new_zipfile_serialization=False``) carries
  no checksum: it is said, not checked.

A damaged file raises :class:`~dp_ckpt_plugin.errors.CorruptCheckpointError`
in one line naming the member or dataset. ``h5py`` is imported only for an
HDF5 file.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass

from ..errors import CorruptCheckpointError
from ..storage import PayloadBytes
from ..text import shown

#: The first bytes of a zip archive (a local file header) and of an HDF5 file.
ZIP_MAGIC = b"PK\x03\x04"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
#: A pickle of protocol 2 or above starts with its PROTO opcode.
PICKLE_PROTO = b"\x80"
_CHUNK = 1 << 20
_ZIP_FAILURES = (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError)


@dataclass(frozen=True)
class Carried:
    """What a file without a commit record was checked by.

    Attributes
    ----------
    kind : str
        ``"zip"``, ``"hdf5"``, ``"pickle"`` (a legacy torch pickle) or
        ``"unknown"``.
    parts : int
        Members (zip) or datasets (HDF5) read whole.
    checksummed : int
        How many of them carry a checksum that was compared: every member
        of a zip archive, the fletcher32 datasets of an HDF5 file.
    """

    kind: str
    parts: int = 0
    checksummed: int = 0

    @property
    def verified(self) -> bool:
        """Whether a checksum the file carries was compared."""
        return self.kind in ("zip", "hdf5")

    def describe(self) -> str:
        """What was checked, in words (said after "no commit record;")."""
        return _SAID.get(self.kind, _SAID["unknown"]).format(self)


#: What :meth:`Carried.describe` says, by kind.
_SAID = {
    "zip": "the CRC32 of all {0.parts} members of its zip archive match",
    "hdf5": "HDF5 read all {0.parts} datasets back, {0.checksummed} "
    "with a fletcher32 checksum, which matches",
    "pickle": "a legacy torch pickle carries no checksum, so it is not verified",
    "unknown": "not a zip archive, an HDF5 file nor a torch pickle: it carries no "
    "checksum known here, so it is not verified",
}


def check_carried(payload: PayloadBytes) -> Carried:
    """Check ``payload`` by the checksums its format carries.

    Raises
    ------
    CorruptCheckpointError
        When it is empty, or a member or dataset fails its check.
    """
    data = payload.data
    if not data:
        raise CorruptCheckpointError(f"checkpoint {payload.path} is damaged: empty")
    if data.startswith(ZIP_MAGIC):
        return _check_zip(payload)
    if data.startswith(HDF5_MAGIC):
        return _check_hdf5(payload)
    return Carried("pickle" if data.startswith(PICKLE_PROTO) else "unknown")


def _damaged(payload: PayloadBytes, what: str, exc: BaseException) -> Exception:
    return CorruptCheckpointError(
        f"checkpoint {payload.path} is damaged: {what} ({shown(exc)})"
    )


def _check_zip(payload: PayloadBytes) -> Carried:
    """Read every member of the archive to its end: zipfile checks each CRC32."""
    try:
        archive = zipfile.ZipFile(payload.reader())
    except _ZIP_FAILURES as exc:
        raise _damaged(payload, "not a whole zip archive", exc) from None
    with archive:
        members = archive.infolist()
        for info in members:
            try:
                with archive.open(info) as member:
                    while member.read(_CHUNK):
                        pass
            except (*_ZIP_FAILURES, NotImplementedError) as exc:
                raise _damaged(
                    payload,
                    f"member {shown(info.filename)} of its zip archive fails its check",
                    exc,
                ) from None
    return Carried("zip", len(members), len(members))


def _check_hdf5(payload: PayloadBytes) -> Carried:
    """Read every dataset back: HDF5 compares the fletcher32 of those that have one."""
    import h5py

    failures = (OSError, RuntimeError, ValueError, KeyError, TypeError)
    try:
        handle = h5py.File(payload.reader(), "r")
    except failures as exc:
        raise _damaged(payload, "HDF5 cannot open it", exc) from None
    with handle:
        names: list[str] = []
        try:
            handle.visititems(
                lambda name, item: (
                    names.append(name) if isinstance(item, h5py.Dataset) else None
                )
            )
        except failures as exc:
            raise _damaged(payload, "HDF5 cannot list its datasets", exc) from None
        checksummed = 0
        for name in names:
            try:
                dataset = handle[name]
                dataset[()]
                checksummed += bool(dataset.fletcher32)
            except failures as exc:
                raise _damaged(
                    payload, f"dataset {shown(name)} fails its check", exc
                ) from None
    return Carried("hdf5", len(names), checksummed)
