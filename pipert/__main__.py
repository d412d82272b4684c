"""`python -m pipert ...` is the `pipert` command."""
import sys

from .cli import main

sys.exit(main())
