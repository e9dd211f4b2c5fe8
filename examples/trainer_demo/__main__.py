"""`python -m trainer_demo` (with `examples/` on PYTHONPATH): see `trainer_demo.run`."""

import sys

from trainer_demo.run import main

if __name__ == "__main__":
    sys.exit(main())
