"""Step 3: a finding repaired with one fenced write, when the settings allow it
(docs/verification.md, "3. Repair")."""
