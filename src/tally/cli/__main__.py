"""``python -m tally.cli``: the ``tally`` command."""

from tally.cli.app import main

raise SystemExit(main())
