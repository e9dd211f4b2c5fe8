"""The pipeline layer: what a `Dataset` is (`spec.PipelineSpec`), how it becomes one slot's nodes
(`build`), one slot's pass (`iteration`), and the features that turn a spec into others — `mixing`
(`Dataset.mix`, the "mixed" source), `mini_epochs`, `subsets` (split, sample, filter) and `consume`.
The Lance materialisation of `.cache()` is `shardcache.snapshots`; resume states are `shardcache.resume`.
Nothing here imports the facades (`Dataset`, `TorchLoader`).
"""
