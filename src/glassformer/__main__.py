"""`python -m glassformer ...` is the same as the `glassformer` command."""

from glassformer.cli import main

raise SystemExit(main())
