"""Background saves: the payload leaves the training loop as a snapshot.

``saves`` keeps at most one save in flight and never loses its error;
``snapshot`` takes the consistent copy in the loop; a save written by another
process goes through ``process`` (the store's side), ``child`` (the writer
process itself) and ``shm`` (snapshot buffers in shared memory).
"""
