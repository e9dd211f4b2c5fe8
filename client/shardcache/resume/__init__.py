"""Resume states, in one place: their version, envelope and layouts (`state`), the checks that refuse a
state naming what differs (`check`), where a Dataset's iteration starts from one (`point`), and merging
every rank's states to resume on another topology (`elastic`; its piece arithmetic is the source layer's,
`shardcache.sources.deal.pieces`). A TorchLoader's own part (its identity and its workers' start states) sits
with the loader, `shardcache.loader.resume`, since it reads the loader's merge state.

Each node owns its state: code here walks a chain of states only through the nodes' own readers
(`Node.state_below`, `ShuffleNode.progress`, `sources.base.unit_position`, `MergeNode.worker_states`).
"""
