import sys

from minigrad_norm.cli import main

sys.exit(main())
