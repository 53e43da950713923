"""A stream batch's records folded into groups, one per rule and parent, with what each
record's images say (docs/verification.md, "Grouping")."""
