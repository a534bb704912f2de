"""What the node knows about primaries that answer for features they do not apply.

A receiving link's source may ask the node for a browser (§3.5.3
``distribution-mode`` ``copy``) or for filters (§3.5.8, e.g. a JMS selector).
The node at the other end says what it applies by putting them in its own
attach. The proxy checks that answer before it fetches anything
(``proxy_links.unhonoured_source``). Some brokers echo the client's source
whole, though:

* RabbitMQ before 4.1 (its ``rabbitmq_amqp1_0`` plugin, measured with 3.10.8,
  and 4.0's native AMQP 1.0, measured with 4.0.5): answers ``copy`` and moves
  the messages (a browser empties the queue), and answers a ``selector``
  filter and delivers every message.

For such a primary the proxy refuses browsers and filters itself, with
``amqp:not-implemented``, instead of trusting the echo, except the filters it
is known to apply: RabbitMQ 4.0's own stream filter,
``rabbitmq:stream-offset-spec`` (measured with 4.0.5: ``first``, ``last``,
``next`` and a numeric offset read a stream from there), goes through, while
a selector beside it is still refused (``filters_applied``, checked per filter
name in ``proxy_links.unhonoured_source``).

A receiver's drain (§2.6.7) asks the sender to use up or give back its credit
and say so. RabbitMQ before 4.0 does not: a drain of 10 on a queue of 3 got 2
messages and no answer, and a drain with credit 1 on an empty queue failed
its channel with ``amqp:internal-error`` (``function_clause`` in
``rabbit_classic_queue``), which ends the session, and with it every other
client's link on the proxy's shared upstream session. For such a primary the
proxy never sends a drain upstream: it answers the client's drain itself
(``proxy_links.ProxyConsumer``).

The ``modified`` outcome (§3.4.5) makes RabbitMQ before 4.0 end the session
the delivery came on, and with it every other client's link on the proxy's
shared upstream session. For such a primary a client's ``modified`` is sent
upstream as ``released`` (§3.4.4): the message goes back to the queue, without
the delivery-count increment, the undeliverable-here flag or the annotations
(``proxy_links.relay_outcome``).

RabbitMQ (3.x and 4.x) has no AMQP 1.0 transactions: a transaction whose work
goes to it is refused by the node at its first transactional transfer or
disposition, naming the primary (``proxy.transactions.forward``); other
primaries are asked (a coordinator link), and a refusal says the same.

A primary is known by the ``product`` and ``version`` properties of its open
frame (§2.7.1).
"""

from __future__ import annotations


def echoes_source_unapplied(properties: dict | None) -> str | None:
    """Why a primary's echo of browse and filter requests cannot be trusted, or None."""
    if not properties:
        return None
    product = str(properties.get("product", ""))
    version = str(properties.get("version", ""))
    if product == "RabbitMQ" and _version(version) < (4, 1):
        return f"RabbitMQ {version} neither browses nor filters (it echoes the request)"
    return None


# filter-set keys (§3.5.8) a primary applies although it echoes what it does not
STREAM_OFFSET = "rabbitmq:stream-offset-spec"


def filters_applied(properties: dict | None) -> frozenset[str]:
    """Filters this primary applies even where ``echoes_source_unapplied`` distrusts its
    echo of the others (measured, see the module note)."""
    if not properties or str(properties.get("product", "")) != "RabbitMQ":
        return frozenset()
    if _version(str(properties.get("version", ""))) >= (4, 0):
        return frozenset({STREAM_OFFSET})
    return frozenset()


def _version(version: str) -> tuple[int, int]:
    """(major, minor) of a version string; 0 for what is not a number."""
    parts = (version.split(".") + ["0", "0"])[:2]
    return tuple(int(p) if p.isdigit() else 0 for p in parts)


def _major(version: str) -> int:
    return _version(version)[0]


def drain_unanswered(properties: dict | None) -> str | None:
    """Why a drain must not be sent to this primary, or None."""
    if not properties:
        return None
    version = str(properties.get("version", ""))
    if str(properties.get("product", "")) == "RabbitMQ" and _major(version) < 4:
        return f"RabbitMQ {version} does not answer a drain"
    return None


def modified_unsupported(properties: dict | None) -> str | None:
    """Why ``modified`` must be sent to this primary as ``released``, or None."""
    if not properties:
        return None
    version = str(properties.get("version", ""))
    if str(properties.get("product", "")) == "RabbitMQ" and _major(version) < 4:
        return f"RabbitMQ {version} ends the session on a modified outcome"
    return None


def transactions_unsupported(properties: dict | None) -> str | None:
    """Why a transaction cannot be forwarded to this primary, or None (ask it)."""
    if properties and str(properties.get("product", "")) == "RabbitMQ":
        return f"RabbitMQ {properties.get('version', '')} has no AMQP transactions".replace("  ", " ")
    return None
