"""The main table: its parents' reads, its members' reads and the fenced writes that repair
(docs/verification.md, steps 2 and 3: the settled read, and what a repair writes)."""
