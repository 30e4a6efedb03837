"""The deepmd-kit host: everything that knows deepmd-kit 3.2.

The trainer-neutral core (the rest of the package) knows nothing of this
folder. Here live the ``deepmd.backend`` entry point (:mod:`.takeover`), the
command dispatch (:mod:`.cli`), the input schema (:mod:`.argcheck`), the
settings read from a training input (:mod:`.settings`), deepmd-kit's names
(:mod:`.naming`) and retention keys (:mod:`.policy`), the preflight run before
anything is built (:mod:`.prepare`), and one folder per deepmd-kit backend
(:mod:`.pt_expt`).

:mod:`.takeover` is loaded by every process that imports ``deepmd.backend``
and imports neither torch nor the rest of this package.
"""
