"""The node layout of a process group, from the host each of its ranks runs on (exchanged once per group).

**Host identity.** A rank's host is `<kernel boot id>/<host name>`. The boot id
(`/proc/sys/kernel/random/boot_id`, a random UUID drawn at every boot) tells machines apart even when
their host names collide (containers started with the same `--hostname` on several machines): two ranks
that merely share a name on two machines would otherwise be taken for one node, whose share two daemons
would then fetch in turn. The host name (the UTS namespace's) splits one machine further: pods of one
machine each get their own share, which still downloads once per machine, only into the same daemon. Both
cost one file read and one system call; nothing here needs the network.

**The exchange is not a collective.** Every rank writes its host into the process group's own key-value
store (the TCPStore or FileStore `init_process_group` made) and waits for the others' keys, with a deadline
(`SHARDCACHE_LAYOUT_WAIT_S`, default 60 s). A collective (`all_gather_object`) would pair with whatever
collective each rank calls next: a rank evaluating alone (rank 0 only) would meet its peers' gradient
all-reduce and corrupt or hang both. Through the store, ranks need not be at the same point: each writes
its key when it first resolves a context (building or measuring a loader, `ds.context`), and waits only
until every rank has done so once. If some never do within the deadline, the group counts as one node and
says so. Whichever outcome comes first is recorded in the store (compare-and-set) and read by every rank,
so no two ranks of one group ever use different layouts.

The outcome is kept per process group in this process (and inherited by forked DataLoader workers, which
never talk to the store: they share the parent's socket to it).
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from shardcache.errors import ConfigError
from shardcache.topology.launchers import NodeLayout

WAIT_ENV = "SHARDCACHE_LAYOUT_WAIT_S"
DEFAULT_WAIT_S = 60.0
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_PREFIX = "shardcache/layout/"
_DECISION = _PREFIX + "decision"
_HOSTS = "hosts"


def host_key() -> str:
    """This process's host as the exchange compares it: `<boot id>/<host name>` (see the module)."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:  # not Linux, or /proc hidden: the host name alone
        boot = ""
    return f"{boot}/{socket.gethostname()}"


@dataclass(frozen=True)
class GroupLayout:
    """A process group's node layout as its hosts give it: `layout`, or None with `problem` saying why not."""

    layout: NodeLayout | None
    problem: str | None = None


def layout_of_hosts(hosts: Sequence[str], rank: int) -> GroupLayout:
    """The node layout of ranks running on `hosts` (rank r on hosts[r]), for the rank `rank`.

    Nodes are numbered by their lowest rank. Every node must run as many ranks (node placement's shares
    are per node); otherwise the group counts as one node, and `problem` names the hosts and their counts.

    Example:
        >>> layout_of_hosts(["a", "a", "b", "b"], 3).layout
        NodeLayout(local_world_size=2, num_nodes=2, local_rank=1, node_rank=1, source='process group')
    """
    ranks: dict[str, list[int]] = {}
    for r, host in enumerate(hosts):
        ranks.setdefault(host, []).append(r)
    sizes = {len(members) for members in ranks.values()}
    if len(sizes) > 1:
        counts = ", ".join(f"{host.rpartition('/')[2] or host}: {len(m)}" for host, m in ranks.items())
        problem = (
            f"the {len(hosts)} ranks run on {len(ranks)} hosts with different numbers of ranks ({counts}); "
            "node placement needs as many ranks on every node"
        )
        return GroupLayout(None, problem)
    nodes = list(ranks)  # in order of each host's lowest rank
    mine = hosts[rank]
    layout = NodeLayout(
        len(ranks[mine]), len(nodes), ranks[mine].index(rank), nodes.index(mine), "process group"
    )
    return GroupLayout(layout)


def wait_s() -> float:
    """How long a rank waits for the others' hosts: `SHARDCACHE_LAYOUT_WAIT_S`, else 60 s."""
    raw = os.environ.get(WAIT_ENV)
    if not raw:
        return DEFAULT_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{WAIT_ENV}={raw}: expected a number of seconds > 0")
    return value


# Each process group this process exchanged hosts in, with the outcome: the group object itself is kept
# (not its id, which a later group could reuse), and the list stays as short as the groups a job makes.
_SEEN: list[tuple[object, GroupLayout]] = []
# One exchange at a time in a process (a loader's threads may resolve contexts at once). Only the trainer's
# process takes it: a forked DataLoader worker reads `_SEEN` and never exchanges.
_EXCHANGING = threading.Lock()


def known_layout(dist: ModuleType) -> GroupLayout | None:
    """The outcome of this process's exchange in the current default group, None before any."""
    group = dist.group.WORLD
    for seen, outcome in _SEEN:
        if seen is group:
            return outcome
    return None


def group_layout(dist: ModuleType) -> GroupLayout:
    """The default process group's layout, exchanging hosts through its store on first use (see the module).

    Only in a process that owns its process group (the trainer's, never a forked DataLoader worker).
    """
    with _EXCHANGING:
        known = known_layout(dist)
        if known is not None:
            return known
        outcome = _exchange(dist)
        _SEEN.append((dist.group.WORLD, outcome))
        return outcome


def _exchange(dist: ModuleType) -> GroupLayout:
    rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
    store = _default_store(dist)
    if store is None:
        return GroupLayout(None, "this torch does not expose the process group's store to exchange hosts")
    keys = [f"{_PREFIX}host/{r}" for r in range(world_size)]
    store.set(keys[rank], host_key())
    waited = wait_s()
    hosts: list[str] | None
    try:
        store.wait(keys, datetime.timedelta(seconds=waited))
        hosts = _values(store, keys)
    except RuntimeError:  # DistStoreError (TCPStore) or RuntimeError (FileStore): the deadline passed
        hosts = None
    # The first rank to finish decides for all: its hosts, or (it timed out) none.
    decision = store.compare_set(_DECISION, "", _HOSTS if hosts is not None else "none")
    if decision != _HOSTS.encode():
        return GroupLayout(
            None,
            f"not every rank of the process group resolved a shardcache context within {waited:g} s of the "
            f"others (a loader built on some ranks only, such as an evaluation on rank 0), so their hosts "
            f"could not be compared; raise {WAIT_ENV} if the ranks start that far apart",
        )
    if hosts is None:  # another rank saw every host before this one gave up: they are all there
        hosts = _values(store, keys)
    return layout_of_hosts(hosts, rank)


def _default_store(dist: ModuleType) -> Any:
    # The default group's store is reachable only through a private function (torch 2.x has had it since
    # 1.x); without it, the exchange cannot happen and the group counts as one node, with a warning.
    getter = getattr(getattr(dist, "distributed_c10d", None), "_get_default_store", None)
    return None if getter is None else getter()


def _values(store: Any, keys: list[str]) -> list[str]:
    raw: list[bytes] = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
    return [value.decode() for value in raw]
