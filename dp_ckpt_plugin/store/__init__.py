"""The checkpoint store and its save line.

``core`` holds :class:`CheckpointStore`, which runs the invariants in one
straight line: ``commit`` (a durable payload, then its commit record),
``publish`` (pointer, alias and mirrors), then retention (``..retention``).
Beside them: ``place`` (the directory, storage and durability, held once),
``catalogue`` (its committed checkpoints in memory), ``family`` (how a store
treats one family), ``lock`` (one writer per directory),
``adoption`` (numbered files that have no record) and ``sweep`` (what a killed
writer left behind). Nothing here knows a host or a serialization format.
"""
