"""A proxy link whose primary is fenced and then claims the queue again, at a new epoch, on the
same node (issue #42, docs/nemesis.md finding 23), on a virtual clock.

The fenced primary ends its peers' proxy links (``amqp:link:detach-forced``: each node finds
the new primary itself). When the new primary is the same node again, the proxy is on the
same upstream pool and must attach again, and what it had sent on the old link without an
answer must go again on the new one: the nemesis's stuck producer (combined seed 6: no
outcome for 52 s, then 36 s, on another node while its primary was paused, fenced and then
primary again) had its transfers left in flight on the ended link, filling its window. The
playbook network drops what crosses a partition, which TCP never does on a connection that
lives on, so a pause is modelled by a slow link (what is sent arrives late).
"""

from __future__ import annotations

import pytest

from playbook import World, run
from test_failover_links import Numbered
from test_replication_playbooks import TTL, etcd_cluster, lose_node, service, three_roles, view

pytestmark = pytest.mark.timeout(60)
ADDRESS = "orders.x"
RULE = {"name": "orders", "match": "orders.*", "kind": "replicated", "replicas": 2,
        "catchup_timeout": 10.0}


async def proxied_producer(tmp_path):
    """Three nodes; a producer on the node that holds no copy, through the proxy path to the
    primary, 10 accepted."""
    world = World(tmp_path)
    etcd, nodes = await etcd_cluster(world, rule=RULE)
    roles = await three_roles(world, nodes, ADDRESS)
    pump = Numbered((await world.client(roles[2], "producer")).sender(ADDRESS))
    await world.until(lambda: pump.upto(10), what="10 accepted through the proxy")
    return world, etcd, nodes, roles, pump


def test_a_proxy_attaches_again_when_its_fenced_primary_claims_the_queue_again(tmp_path):
    async def play():
        world, etcd, nodes, (primary, backup, third), pump = await proxied_producer(tmp_path)

        # the backup goes for good: the primary goes on alone
        await lose_node(world, nodes, backup)
        await world.until(lambda: pump.upto(20), timeout=TTL + 5, what="10 more, alone")

        # the primary cut off from etcd past its lease: fenced; then back, the only node
        # that may serve the queue, it claims it again at a new epoch
        epoch = view(nodes[primary], ADDRESS)["epoch"]
        nodes[primary].coordinator.store.partition()
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") != "primary",
                          timeout=TTL + 2, what="the primary fenced")
        await world.quiet(TTL)
        nodes[primary].coordinator.store.heal()
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") == "primary"
                          and view(nodes[primary], ADDRESS)["epoch"] > epoch,
                          timeout=3 * TTL, what="the same node primary again, a new epoch")
        await world.until(lambda: pump.upto(30), timeout=TTL + 2,
                          what="the proxy's producer accepted again")
        await world.close()

    run(play)


def test_links_go_on_when_the_new_primary_becomes_a_known_member_after_its_claim(tmp_path):
    """The third node learns the new owner from its claim before it has the owner's
    registration (its AMQP URL): nowhere to send its links yet. When the member shows up, they
    go on there. (A lead for docs/nemesis.md finding 23 that this rules out: it passed as
    first written.)"""
    async def play():
        world, etcd, nodes, (primary, backup, third), pump = await proxied_producer(tmp_path)

        # the third node does not see the backup's registration for a while
        watcher = service(nodes[third])
        members = watcher.members
        hidden = {backup}
        watcher.members = lambda: {k: v for k, v in members().items() if k not in hidden}
        watcher.known.pop(backup, None)

        await lose_node(world, nodes, primary)
        await world.until(lambda: view(nodes[third], ADDRESS).get("primary") == backup,
                          timeout=2 * TTL, what="the third node told of the new owner")
        pump.upto(12)
        await world.quiet(1.0)
        hidden.clear()  # now it is seen, with the next change of the members: the old one back
        world.network.reboot(primary)
        nodes[primary] = await world.node(primary, etcd=etcd, rules=[RULE],
                                          cluster={"etcd": ["http://memory:2379"], "lease_ttl": TTL})
        await world.until(lambda: pump.upto(20), timeout=TTL + 2,
                          what="the proxy's producer accepted by the new primary")
        await world.close()

    run(play)


def test_what_a_proxy_had_in_flight_goes_again_when_its_fenced_primary_claims_again(tmp_path):
    """The nemesis's path (combined seed 6, twice): the primary paused with the proxy's
    transfers in flight to it. It wakes fenced, ends the proxy's link (detach-forced), and
    later claims the queue again itself. The proxy attaches again on the same upstream pool:
    what it had sent on the old link and never had an answer for must go again on the new
    one, or the client waits for outcomes that never come (52 s and 36 s in the nemesis, until
    another fault moved the queue)."""
    async def play():
        world, etcd, nodes, (primary, backup, third), pump = await proxied_producer(tmp_path)
        await lose_node(world, nodes, backup)
        await world.until(lambda: pump.upto(20), timeout=TTL + 5, what="10 more, alone")

        # the primary freezes for the proxy (what is sent arrives late, nothing is lost) and
        # for etcd: its lease runs out while the proxy's 10 transfers wait to be read
        epoch = view(nodes[primary], ADDRESS)["epoch"]
        world.network.slow(third, primary, TTL + 2)
        nodes[primary].coordinator.store.partition()
        pump.upto(30)
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") != "primary",
                          timeout=TTL + 2, what="the primary fenced")
        await world.quiet(TTL)
        world.network.slow(third, primary, 0)
        nodes[primary].coordinator.store.heal()
        await world.until(lambda: view(nodes[primary], ADDRESS).get("role") == "primary"
                          and view(nodes[primary], ADDRESS)["epoch"] > epoch,
                          timeout=3 * TTL, what="the same node primary again, a new epoch")
        await world.until(lambda: pump.upto(40), timeout=TTL + 2,
                          what="what was in flight, then 10 more, accepted")
        assert pump.accepted_ids() == set(range(40))
        await world.close()

    run(play)
