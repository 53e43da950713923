"""Step 5 and what comes later: alerts, the standing state, and rechecks sent to the delay
queue (docs/verification.md, "5. Alerts")."""
