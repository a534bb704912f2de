"""Seeded fuzzing of a live node: malformed AMQP 1.0 and SASL frames over real sockets.

``frames`` makes the byte streams (one per connection: a valid prefix, then
mutated frames); ``runner`` sends them to a node from many concurrent
connections, with a canary client and memory checks. Used by
``tests/faults/test_fuzz.py`` (short run in ``make test``, long one in ``make fuzz``).
"""
