"""Integration with deepmd-kit 3.2's ``pt_expt`` (PyTorch-exportable) backend.

:mod:`.entry` is loaded by every process that imports ``deepmd.backend`` (the
``deepmd.backend`` entry-point group) and imports neither torch nor the rest of
this package. Everything else here is imported only when ``dp --pt-expt`` runs
a command.
"""
