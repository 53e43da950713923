"""The ``tally`` command, local mode's top floor. Its entry point is ``app.main``, exported
here as well: the console script names ``tally.cli:main``, in installs old and new."""

from tally.cli.app import main

__all__ = ["main"]
