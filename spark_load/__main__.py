import sys

from spark_load.cli import main

sys.exit(main())
