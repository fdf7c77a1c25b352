import sys

from sftree.cli import main

sys.exit(main())
