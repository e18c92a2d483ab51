import sys

from ebb.native import _load
from ebb.native.build import main

sys.exit(main(loads=lambda path: _load(path) is not None))
