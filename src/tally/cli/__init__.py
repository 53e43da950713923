"""The ``tally`` command (local mode's top floor): ``app`` is its entry point."""
