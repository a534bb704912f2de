"""Where and how the node connects to a primary: URL, credentials, per-rule options."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

log = logging.getLogger("fedgate.upstream")

UNIX_SCHEME = "amqp+unix"  # amqp+unix:///path: AMQP over a Unix socket, between a node's workers

@dataclass(frozen=True)
class UpstreamTarget:
    """Where and how to connect: a primary URL plus per-rule options."""

    scheme: str
    host: str
    port: int
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    heartbeat: float = 10.0
    idle_timeout: float = 60.0
    pool_size: int = 1
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    split_directions: bool = True
    max_send_failures: int = 2  # proxy.upstream.suspects
    vhost: str | None = None  # RabbitMQ's virtual host: the open frame's hostname "vhost:NAME"

    @property
    def key(self) -> tuple:
        return (self.scheme, self.host, self.port, self.user, self.tls_ca, self.tls_cert, self.vhost)

    @property
    def display(self) -> str:
        if self.scheme == UNIX_SCHEME:
            return f"{self.scheme}://{self.host}"
        user = f"{self.user}@" if self.user else ""
        return f"{self.scheme}://{user}{self.host}:{self.port}"

    @property
    def unix_path(self) -> str | None:
        """The socket path of an ``amqp+unix:///path`` target (another worker of this node)."""
        return self.host if self.scheme == UNIX_SCHEME else None

    @classmethod
    def from_url(cls, url: str, **options) -> "UpstreamTarget":
        parts = urlsplit(url)
        if parts.scheme == UNIX_SCHEME and parts.path:  # a worker of this node (proxy.workers)
            return cls(scheme=UNIX_SCHEME, host=parts.path, port=0, **options)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError(f"not an amqp:// or amqps:// URL: {url!r}")
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        options.setdefault("user", user)
        options.setdefault("password", password)
        return cls(scheme=parts.scheme, host=parts.hostname, port=port, **options)

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "amqps":
            return None
        context = ssl.create_default_context(cafile=self.tls_ca)
        if self.tls_cert:
            context.load_cert_chain(self.tls_cert, self.tls_key)
        return context
