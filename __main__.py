"""`python -m troupe`: the CLI."""

from troupe.ops.cli import main

raise SystemExit(main())
