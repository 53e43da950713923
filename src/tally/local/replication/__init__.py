"""The multi-Region emulator's replication: what Global Tables (MREC) do to an item between
Regions (docs/global-tables.md), decided without I/O in ``versions``."""
