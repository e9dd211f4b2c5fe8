"""The Lance source: rows planned by the source itself (order), read through the daemon or directly
(access, rows), encoded for snapshots (codec), reference columns resolved (refs), and the on-disk index of
a filter (index, store)."""
