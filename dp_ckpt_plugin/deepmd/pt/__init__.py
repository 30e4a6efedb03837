"""The ``dp --pt`` host: deepmd-kit's main PyTorch trainer and freeze.

This ``__init__`` declares the host (:data:`DESCRIPTOR`) and imports nothing
heavy; its modules are imported only when ``dp --pt train``, ``freeze`` or
``change-bias`` runs.
"""

from ..host import HostDescriptor

#: What this host is (read by the shared code of :mod:`dp_ckpt_plugin.deepmd`).
DESCRIPTOR = HostDescriptor(
    name="pt",
    flag="--pt",
    backend=("deepmd.backend.pytorch", "PyTorchBackend"),
    keys=("pt", "pytorch"),
    deepmd_main="deepmd.pt.entrypoints.main",
    trainer="deepmd.pt.train.training",
    main_lines=(
        ("DEBUG", "Log handles were successfully set"),
        ("INFO", "DeePMD version: {version}"),
    ),
)
