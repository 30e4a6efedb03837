"""The remote side of a store that has none (a local ``save_dir``)."""

from __future__ import annotations


class LocalOnly:
    """What :class:`~dp_ckpt_plugin.store.core.CheckpointStore` calls when nothing is uploaded.

    The same methods as :class:`~dp_ckpt_plugin.remote.replica.RemoteStore`,
    each doing nothing, so the store's save line is one straight line for
    both.
    """

    url = None
    staging = None
    epoch = None  # no writer epoch: its checkpoints record no lineage

    def start(self, store=None) -> None:
        """Nothing to take or send."""

    def finish(self, staging) -> None:
        """Nothing in flight."""

    def check(self) -> None:
        """Nothing can fence a local store off."""

    def submit(self, jobs) -> None:
        """Nothing to upload."""

    def protected(self, prefix: str) -> set[str]:
        """Nothing waits for an upload."""
        return set()

    def start_run(self) -> None:
        """Nothing remote to archive."""

    def source(self, store) -> None:
        """No remote store to resolve in."""

    def staged(self, found, store, *, continues: bool):
        """A checkpoint found is where it is."""
        return found

    def read_input(self, digest: str) -> None:
        """No remote store keeps an input."""
