"""The ``dp --pt-expt`` host: deepmd-kit's PyTorch-exportable trainer and freeze.

This ``__init__`` declares the host (:data:`DESCRIPTOR`) and imports nothing
heavy; its modules are imported only when ``dp --pt-expt train`` or
``freeze`` runs.
"""

from ..host import HostDescriptor

#: What this host is (read by the shared code of :mod:`dp_ckpt_plugin.deepmd`).
DESCRIPTOR = HostDescriptor(
    name="pt_expt",
    flag="--pt-expt",
    backend=("deepmd.backend.pt_expt", "PyTorchExportableBackend"),
    keys=("pt-expt", "pytorch-exportable"),
    deepmd_main="deepmd.pt_expt.entrypoints.main",
    trainer="deepmd.pt_expt.train.training",
    main_lines=(("INFO", "DeePMD-kit backend: pt_expt (PyTorch Exportable)"),),
)
