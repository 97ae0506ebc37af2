import sys

from pipeline.cli.prb import main

sys.exit(main())
