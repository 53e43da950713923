"""The protocol's decisions as functions of values: no boto3, no clients, no clock.

docs/verification.md's steps, in its order: ``batching`` (item collections, the carry's
window), ``carry`` (step 1b: folding remainders), ``judgement`` (step 2: a parent's counter
against its children's truth), ``lifecycle`` (parents that are gone: orphans and emptied
parents on a second look), ``gaps`` (step 4: missing runs, duplicates, the counter against
its members). The I/O around them (reads, fenced writes, the audit table, alerts) lives
one level up, in ``tally.reconciler``.
"""
