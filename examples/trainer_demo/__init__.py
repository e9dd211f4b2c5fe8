"""The trainer demo (`make demo`): ranks with DataLoader workers train on an S3 dataset through the daemon.

An example beside the package, not part of it: run it from a clone of the repository with `make demo`, or
`PYTHONPATH=examples python -m trainer_demo --help`. `shardcache demo` runs it too when shardcache is
installed from the repository (`pip install -e '.[demo]'`).
"""
