"""Test doubles: storages that stand in for a real one in the tests.

:mod:`doubles.directory` is an object store emulated on a directory. No
production path imports them; tests import them as ``doubles.<module>`` (the
tests' folder is on ``sys.path``).
"""
