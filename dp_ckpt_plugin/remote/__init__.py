"""A checkpoint store on object storage: ``save_dir: "s3://bucket/run"``.

The layout under the store's URL ``U`` (one prefix of one bucket)::

    U/HEAD                               the one small pointer object, moved only by
                                         compare-and-swap, never to an older step
    U/LEASE                              the writer lease: epoch and holder
    U/e000002/model.ckpt-30.pt           a payload, immutable, under the epoch of the
                                         run that wrote it
    U/e000002/.model.ckpt-30.pt.commit.json   its commit record, created if absent
    U/archive/20261203T101500Z.json      an earlier run's HEAD, kept with what it names

A run saves into a local *staging* store first (the POSIX store, with every
rule of a local ``save_dir``) and a background uploader copies each committed
checkpoint up: payload, then record, then HEAD (:mod:`.replica`). Readers go
HEAD, record, payload and verify size and digest (:mod:`.fetch`); listing is
used only to recover (:mod:`.recovery`), never to find the latest checkpoint.

A writer holds the lease (:mod:`.lease`); each lease taken bumps its epoch,
and HEAD carries the epoch of the last writer that moved it, so a writer that
was paused or cut off while another took over can never move HEAD again nor
delete anything: it deletes only what its own successful swap of HEAD stopped
naming (:mod:`.head`).
"""
