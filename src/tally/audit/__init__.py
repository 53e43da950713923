"""The full audit: every parent of the table checked against its children, by a scan or by
one SQL query over an export (docs/audit.md), on the reconciler's own judgement."""
