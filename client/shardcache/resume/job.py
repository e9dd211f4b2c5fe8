"""Job-wide resume states: every data-parallel rank's position in one state, for frameworks that save one.

Lightning and Accelerate call a loader's `state_dict()` on every rank at once, but write only rank 0's
result into the checkpoint, and hand that one state to every rank on resume. A per-rank state cannot
serve rank 1; `job_state` gathers every rank's state (a collective: every rank must call it, as both
frameworks do) and merges them (`shardcache.resume.elastic.merge_states`), so the one state saved resumes
each rank exactly where it was — and, like any merged state, on another layout too.
"""

from __future__ import annotations

from shardcache.context import torch_distributed
from shardcache.resume.elastic import merge_states
from shardcache.resume.state import StateDict


def job_state(state: StateDict) -> StateDict:
    """Every rank's `state` merged into one (this rank's own without torch.distributed or with one rank).

    A collective over the default process group: call it on every rank at the same step.
    """
    dist = torch_distributed()
    if dist is None or int(dist.get_world_size()) == 1:
        return state
    states: list[StateDict | None] = [None] * int(dist.get_world_size())
    dist.all_gather_object(states, state)
    return merge_states([s for s in states if s is not None])
