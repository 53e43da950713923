"""The protocol's decisions as functions of values: no boto3, no clients, no clock.

One module per section of docs/verification.md, in its order: ``balance`` (1. the fast
path: did a batch's writes cancel out), ``carry`` (1b. folding a hot parent's remainder, and
how much of its window is left), ``judgement`` (2. a parent's counter against its children's
truth), ``lifecycle`` (parents that are gone: orphans and emptied parents on a second look),
``window`` (children found through an index: what the stream showed of them lately counts,
not what the index shows yet), ``stamps`` (parents that never rest: a moving parent judged
at a revision whose every change is proven known), ``repair`` (3. whether a finding may be
repaired, and what the settings refuse), ``gaps`` (4. missing runs, duplicates, the counter
against its members), ``batching`` (item collections verified at once), ``regions`` (a
Global Table: the losses a Region reads from its own stream, and each parent's home Region),
``shards`` (a counter split per Region: its total, and what its repair writes).
The I/O around them (reads, fenced writes, the audit table, alerts) lives in
``tally.reconciler``'s other rooms.
"""
