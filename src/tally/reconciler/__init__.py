"""The reconciler: verifies counters against their children from the table's stream.

Its rooms follow docs/verification.md, lowest first: ``protocol`` (the decisions), the shared
``findings`` and ``stats``, ``table`` (the main table), ``store`` (the audit table), ``stream``
(a batch's records into groups), ``report`` (alerts and rechecks), ``repair``, ``checks`` (the
steps), and the facade ``verification`` with the functions' wiring ``runtime``.
"""
