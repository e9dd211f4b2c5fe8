"""The deal: which units each slot reads, epoch by epoch (partition, schedule of plans, elastic pieces,
subsets, the counting pass `even=` needs). Pure arithmetic over units; sources read what it deals."""
