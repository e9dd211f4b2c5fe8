"""Daemon access: everything the client does to reach the node daemon, and to read without it.

The layer under the pipeline (see docs/architecture.md): it finds the daemon's socket (`discovery`),
speaks the open/release wire on it (`transport`, `open_wire`) and the control plane (`control`: plans,
stats, telemetry), knows whether the daemon answers and waits out a restart (`availability`), reads a shard
directly when it must (`direct`), and puts these behind one object (`daemon_client.DaemonClient`, exported
as `shardcache.DaemonClient`). `telemetry` reports what the trainer consumed (`shardcache.Telemetry`).

It imports only the base modules of `shardcache` (errors, extras, forksafe, jobs, ...), itself and the wire
contract `shardcache_protocol`; never a source, stage, `Dataset` or torch (`tests/client/test_layers.py`).

Why the name: "daemon" alone is the server package (`shardcached`, in the repository's `daemon/` folder) and
"cache" already names two things of the client (`shardcache.snapshots`, the Lance materialisation, and the
`.cache()` stage). This package is neither: it is the client's access to the daemon.

Importing the package imports none of its modules; import the one you need.
"""
