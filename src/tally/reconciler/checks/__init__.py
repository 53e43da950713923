"""The steps that verify a group: the fast path, the carry, the settled recount (counts),
gaps (sequences), second looks, and item collections at once (docs/verification.md, steps
1 to 4)."""
