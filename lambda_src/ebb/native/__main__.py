import sys

from ebb.native.build import main

sys.exit(main())
