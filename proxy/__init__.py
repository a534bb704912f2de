"""fedgate node core: the AMQP 1.0 broker node, its connections, SASL, local queues and CLI."""
