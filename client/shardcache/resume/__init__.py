"""Resume states, in one place: their version and envelope (`state`), the checks that refuse a state
naming what differs (`check`), where a Dataset's iteration starts from one (`point`), a TorchLoader's
(`loader`), and merging every rank's states to resume on another topology (`elastic`; its piece
arithmetic is the source layer's, `shardcache.sources.pieces`).
"""
