"""The ``dp --pt`` host: deepmd-kit's main PyTorch trainer and freeze.

Imported only when ``dp --pt train``, ``freeze`` or ``change-bias`` runs.
"""
