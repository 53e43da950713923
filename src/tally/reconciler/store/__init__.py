"""The audit table's parts, each named for what it keeps: the log of findings and repairs,
standing findings, the alerts' outbox, sequences' watermarks, carries and the stream's
window of children found through an index (docs/audit-table.md)."""
