"""The deepmd-kit host: everything that knows deepmd-kit 3.2.

The trainer-neutral core (the rest of the package) knows nothing of this
folder. Shared by every deepmd-kit backend: the ``deepmd.backend`` entry
point and version guard (:mod:`.takeover`), the command dispatch
(:mod:`.cli`), the input schema (:mod:`.argcheck`), the settings read from a
training input (:mod:`.settings`), deepmd-kit's names (:mod:`.naming`) and
retention keys (:mod:`.policy`), the preflight run before anything is built
(:mod:`.prepare`) with the adoption of a plain deepmd-kit ``save_dir``
(:mod:`.adopt`), the trainer side (:mod:`.checkpointing`), stop signals
(:mod:`.preempt`), the log lines (:mod:`.logs`) and the process group
(:mod:`.runtime`). One folder per deepmd-kit backend holds what differs:
:mod:`.pt_expt` (``dp --pt-expt``) and :mod:`.pt` (``dp --pt``).

:mod:`.takeover` is loaded by every process that imports ``deepmd.backend``
and imports neither torch nor the rest of this package.
"""
