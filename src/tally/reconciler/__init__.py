"""The reconciler: verifies counters against their children from the table's stream."""
