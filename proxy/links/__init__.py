"""Client links bridged to links on primaries.

Owns: ``proxy_links`` (``ProxyConsumer``, ``ProxyProducer``: credit passed
through, outcomes relayed, replay), ``shared_consumers`` (one upstream
receiver shared by many clients), ``remote_destinations`` (internal senders
for exchanges and the relay), ``redirects`` (links moved by rule changes).
May import: ``proxy.upstream``, ``proxy.amqp``, ``routing``.
"""
