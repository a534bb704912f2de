"""Topic subscriptions on a node with workers (``[node] workers`` > 1; docs/exchanges.md).

How this works
--------------
Every worker serves exchanges and their publishers; a subscription is a local queue that
lives on one worker, its *host*:

* a durable or shared subscription's host is the worker the supervisor's table of owners
  names for ``subscription:<name>`` (``proxy.workers.ownership``, asked once per name): one
  worker for all its consumers, wherever they connect, and the same one after a restart;
* a non-durable, unshared one lives where its consumer is (its name says which worker).

A subscriber that lands on another worker is forwarded to the host (``ForwardedSubscriber``:
a proxy consumer on the workers' Unix sockets, as a link to another worker's queue is), its
source as the client sent it, and its identity (container id, link name: the subscription's
name, and no-local's container) in the link property ``fedgate:subscriber``, read on trusted
connections only. Its detach goes on as it came: closed (JMS ``unsubscribe``) or not (the
subscription stays). A lookup by link name (no address) goes to the worker that has a
subscription of that name.

Each worker tells the others, through the supervisor (``s`` / ``S`` channel messages,
``proxy.workers.worker``), of each subscription it makes or removes: name, exchange, queue,
selector, no-local, durable. A publisher's worker routes to its own subscriptions and to
the others' (their selector and no-local applied here), each through an internal sender to
the host's queue (outcome end to end, as a bound queue another worker owns is reached). The
host claims the queue's name in the table of owners, so that the sender lands there. A
worker that stops: the supervisor drops its non-durable subscriptions from every worker's
view; publishes to its durable ones are released until it is back (the publisher sends
again: nothing is lost for them).
"""

from __future__ import annotations

import logging

from cproton import pn_link_detach
from proton import Link, symbol

from proxy import selectors
from proxy.links.proxy_links import ProxyConsumer
from proxy.upstream.owner import UplinkState

log = logging.getLogger("fedgate.exchanges")

SUBSCRIBER = "fedgate:subscriber"  # link property: [container id, link name] of the client


def identity(handler, link) -> tuple[str, str]:
    """(container id, link name) of a subscriber: the client's, also when another worker
    forwarded its link (the property, on a trusted connection only)."""
    if getattr(handler, "trusted", False):
        props = link.remote_properties or {}
        value = props.get(symbol(SUBSCRIBER)) or props.get(SUBSCRIBER)
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return str(value[0]), str(value[1])
    connection = handler.server_connection
    container = (connection.remote_container or "") if connection is not None else ""
    return container, link.name


class ForwardedSubscriber(ProxyConsumer):
    """A subscriber whose subscription another worker hosts. Its attach is answered once the
    host answered, with the host's source: the subscription exists when the client hears
    of it (JMS: messages published after ``createDurableSubscriber`` returns are its own)."""

    subscription = "forwarded"  # the handler records whether its detach said closed
    remote_closed = False
    answered = False

    def link_attached(self) -> None:
        if not self.answered:
            self.answered = True
            link = self.link
            link.source.copy(self.up_link.remote_source)
            link.target.copy(link.remote_target)
            link.snd_settle_mode = Link.SND_SETTLED if self.presettled else Link.SND_UNSETTLED
            link.rcv_settle_mode = Link.RCV_FIRST
            link.open()
            self.handler.mark_dirty()
        super().link_attached()

    def link_refused(self, condition) -> None:
        if self.answered or self.closed:
            super().link_refused(condition)
            return
        self.handler.refuse_link(self.link, condition.name if condition else "amqp:internal-error",
                                 (condition.description or "") if condition else
                                 "the worker that holds the subscription did not answer")

    def __init__(self, handler, link, upstream, address, who: tuple[str, str]) -> None:
        self.properties = {symbol(SUBSCRIBER): list(who)}  # before the upstream attach
        super().__init__(handler, link, upstream, address,
                         presettled=link.remote_snd_settle_mode == link.SND_SETTLED)

    def detach_upstream_link(self) -> None:
        """The client's detach, as it came: without closed, the subscription stays."""
        if not (self.closed and not self.remote_closed and self.up_ptr is not None):
            super().detach_upstream_link()
            return
        self.member.unregister(self.up_ptr)
        if not self.member.drop_unopened(self.up_ptr):
            pn_link_detach(self.up_ptr)
        self.member.mark_dirty()
        if self.up_state is not UplinkState.LEFT:
            self._move(UplinkState.WAITING)


class AcrossWorkers:
    """One worker's part: where subscriptions are, and the others' as it heard of them."""

    def __init__(self, subscriptions, worker) -> None:
        self.subscriptions = subscriptions
        self.broker = subscriptions.broker
        self.worker = worker  # proxy.workers.worker.WorkerContext
        self.index = worker.index
        # the other workers' subscriptions: exchange -> name -> (worker, queue, selector, no-local)
        self.remote: dict[str, dict[str, tuple]] = {}
        self.where: dict[str, int] = {}  # name -> its worker (others' only)
        worker.on_subscription = self.heard

    def host(self, name: str) -> int:
        return self.worker.owners.owner(f"subscription:{name}")

    def claim(self, queue_name: str) -> None:
        """The subscription's queue is this worker's (publishers' senders land here)."""
        owners = self.worker.owners
        if owners.ask is None:
            return
        owner = owners.claim(queue_name)
        if owner != self.index:
            log.error("subscription queue %s: the table of owners names worker %d, not this "
                      "one (%d): publishers on other workers reach it there", queue_name, owner,
                      self.index)

    def announce(self, op: str, sub) -> None:
        self.worker.announce_subscription(op, {
            "name": sub.name, "exchange": sub.exchange, "queue": sub.queue.name,
            "selector": sub.selector_text, "no_local": sub.no_local, "durable": sub.durable})

    def heard(self, worker: int, op: str, entry: dict) -> None:
        name, exchange = entry.get("name"), entry.get("exchange")
        if not isinstance(name, str) or not isinstance(exchange, str) or worker == self.index:
            return
        if op != "+":
            if self.where.get(name) == worker:
                del self.where[name]
                self.remote.get(exchange, {}).pop(name, None)
            return
        selector = None
        if entry.get("selector"):
            try:
                selector = selectors.parse(entry["selector"])
            except selectors.SelectorError:
                log.error("subscription %s of worker %d: selector does not parse", name, worker)
                return
        self.where[name] = worker
        self.remote.setdefault(exchange, {})[name] = (worker, entry.get("queue"), selector,
                                                      entry.get("no_local"))

    def route(self, exchange: str, payload: bytes, origin: str | None) -> list:
        """[(upstream, queue address)] of the other workers' subscriptions that take it."""
        found = self.remote.get(exchange)
        if not found:
            return []
        out = []
        for worker, queue, selector, no_local in found.values():
            if (no_local is None or no_local != origin) and (
                    selector is None or selector.matches(payload)):
                out.append(self._target(worker, queue))
        return out

    def _target(self, worker: int, address: str) -> tuple:
        decision = self.worker.forward(worker, address, f"a topic subscription on worker {worker}")
        return self.broker.upstreams.for_decision(decision), address

    def forward(self, handler, link, worker: int, address: str | None, who) -> None:
        """The subscriber's link goes on to the worker that hosts its subscription."""
        upstream, _ = self._target(worker, address or "")
        endpoint = ForwardedSubscriber(handler, link, upstream, address, who)
        handler.links[endpoint.link_ptr] = endpoint

    def worker_of(self, names) -> int | None:
        """The other worker that has a subscription of one of ``names``; None: none."""
        for name in names:
            if name in self.where:
                return self.where[name]
        return None
