"""AMQP 1.0 transactions (§4): the coordinator, transactional work, commit and rollback.

Owns: ``wire`` (declare, discharge and the transactional delivery states as
proton carries them), ``transaction`` (a transaction as data: its states and
moves, its home, the work it holds), ``coordinator`` (a client's coordinator
link and a connection's table of transactions), ``local`` (commit and
rollback on this node's queues: one journal record, then applied, then the
queues' commit barriers), ``forward`` (a transaction forwarded to one primary
over its upstream connection), ``late_state`` (a transactional-state on a later
frame of a transfer, or in a disposition, seen and refused), ``manager`` (the
node's settings, timeouts and counters). May import: ``proxy.amqp``, ``proxy.journal``, ``proxy.queues``,
``proxy.upstream``, ``proxy.links``. Link endpoints below it reach a
connection's table through their handler (``handler.transactions``), never by
import.
"""
