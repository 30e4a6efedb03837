"""The ``dp --pt-expt`` host: deepmd-kit's PyTorch-exportable trainer and freeze.

Imported only when ``dp --pt-expt train`` or ``freeze`` runs.
"""
