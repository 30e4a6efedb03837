"""Test doubles: storages that stand in for a real one in the tests.

:mod:`doubles.directory` is an object store emulated on a directory,
:mod:`doubles.memory` one held in the process with faults and pauses (its
``serve_memory`` serves ``memory://`` URLs; ``conftest.py`` calls it). No
production path imports them; tests import them as ``doubles.<module>`` (the
tests' folder is on ``sys.path``).
"""
