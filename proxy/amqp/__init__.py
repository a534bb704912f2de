"""AMQP over proton's engine: the server connection and helpers on raw proton objects.

Owns: ``engine`` (driving proton's Transport/Connection/Collector, the event
pump, reading and sending transfers), ``connection`` (one client connection:
protocol headers, SASL in front of proton, the first-frame guard), message
header and subject helpers, delivery ``outcomes`` and ``termini`` fields.
May import: ``proxy.auth`` (the SASL layer sits in front of proton).
"""
