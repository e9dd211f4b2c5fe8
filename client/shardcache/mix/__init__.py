"""The mix iterators and their arithmetic (nodes layer): `plan` computes how many samples each source gives
per epoch and slot, `stream` interleaves the sources' passes (proportionally, or as recipe batches).

Neither knows datasets or shards: `shardcache.pipeline.mixing` (`Dataset.mix`) builds the sources and
hands each
iterator a way to open one pass of one source. Imports here go only to base (`tests/client/test_layers.py`).
"""
