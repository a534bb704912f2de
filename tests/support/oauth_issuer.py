"""A token issuer for the OAuth tests: keys made per run, a JWKS endpoint, signed JWTs.

``Issuer`` holds signing keys (RSA, EC P-256, Ed25519) made when it is built,
never written anywhere but the test's tmp dir. ``serve()`` starts an aiohttp
JWKS endpoint on a thread of its own (``jwks_url``), which publishes the keys
currently in ``published`` and counts its fetches. ``token(...)`` signs a JWT
with a chosen key and claims; ``rotate()`` makes a new key and publishes it
(the old one stays usable until ``retire``). Hostile tokens (``alg: none``,
HMAC signed with the RSA public key) are built by hand, as an attacker would,
since PyJWT refuses to make them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import socket
import threading
import time

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ISSUER = "https://idp.test/realms/fedgate"
AUDIENCE = "fedgate-dmz"
ALG_OF = {"rsa": "RS256", "ec": "ES256", "ed": "EdDSA"}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def new_key(kind: str):
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if kind == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    return ed25519.Ed25519PrivateKey.generate()


def public_pem(private) -> bytes:
    return private.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)


class Issuer:
    def __init__(self, issuer: str = ISSUER, audience: str = AUDIENCE) -> None:
        self.issuer = issuer
        self.audience = audience
        self.keys: dict[str, tuple[str, object]] = {}  # kid -> (kind, private key)
        self.published: list[str] = []
        self.fetches = 0
        self._count = 0
        for kind in ("rsa", "ec", "ed"):
            self.add_key(kind)
        self.jwks_url: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # -- keys ------------------------------------------------------------------
    def add_key(self, kind: str, publish: bool = True) -> str:
        self._count += 1
        kid = f"{kind}-{self._count}"
        self.keys[kid] = (kind, new_key(kind))
        if publish:
            self.published.append(kid)
        return kid

    def rotate(self, kind: str = "rsa") -> str:
        return self.add_key(kind)

    def retire(self, kid: str) -> None:
        self.published.remove(kid)

    def kid_of(self, kind: str) -> str:
        return next(k for k in self.published if self.keys[k][0] == kind)

    def jwks(self) -> dict:
        keys = []
        for kid in self.published:
            kind, private = self.keys[kid]
            jwk = json.loads(jwt.algorithms.get_default_algorithms()[ALG_OF[kind]].to_jwk(private.public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": ALG_OF[kind]})
        return {"keys": keys}

    # -- tokens ----------------------------------------------------------------
    def claims(self, sub: str = "alice", scope: str = "", ttl: float = 300.0, **extra) -> dict:
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": self.audience, "sub": sub, "iat": now,
                  "exp": now + ttl, "scope": scope}
        claims.update(extra)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, sub: str = "alice", scope: str = "", ttl: float = 300.0, kid: str | None = None,
              kind: str = "rsa", headers: dict | None = None, **extra) -> str:
        kid = kid or self.kid_of(kind)
        kind, private = self.keys[kid]
        return jwt.encode(self.claims(sub, scope, ttl, **extra), private, algorithm=ALG_OF[kind],
                          headers={"kid": kid, **(headers or {})})

    def unsigned(self, sub: str = "alice", scope: str = "", **extra) -> str:
        """``alg: none``: no signature at all."""
        header = {"alg": "none", "typ": "JWT", "kid": self.kid_of("rsa")}
        body = self.claims(sub, scope, **extra)
        return f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(body).encode())}."

    def hmac_with_public_key(self, sub: str = "alice", scope: str = "", **extra) -> str:
        """HS256 whose secret is the RSA public key's PEM (the classic key-confusion attack)."""
        kid = self.kid_of("rsa")
        header = {"alg": "HS256", "typ": "JWT", "kid": kid}
        body = self.claims(sub, scope, **extra)
        signing = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(body).encode())}"
        mac = hmac.new(public_pem(self.keys[kid][1]), signing.encode(), hashlib.sha256).digest()
        return f"{signing}.{b64url(mac)}"

    # -- the JWKS endpoint -----------------------------------------------------------
    def serve(self) -> "Issuer":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        ready = threading.Event()

        async def jwks(_request):
            self.fetches += 1
            return web.json_response(self.jwks())

        async def main():
            app = web.Application()
            app.router.add_get("/certs", jwks)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.SockSite(self._runner, sock).start()
            ready.set()

        def run():
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(main())
            self._loop.run_forever()
            self._loop.run_until_complete(self._runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True, name="jwks")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the JWKS endpoint did not start")
        self.jwks_url = f"http://127.0.0.1:{port}/certs"
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def node_config(issuer: Issuer, **oauth) -> dict:
    """A node taking this issuer's tokens: PLAIN (token as password) and OAUTHBEARER, SASL required.

    PLAIN without TLS on loopback in the tests; a DMZ listener has [tls]."""
    from admin_client import ADMIN_TOKEN

    return {
        "sasl": {"mechanisms": ["PLAIN", "OAUTHBEARER"], "require": True, "allow_plain_without_tls": True},
        "oauth": {"issuer": issuer.issuer, "audience": issuer.audience, "jwks_url": issuer.jwks_url,
                  "leeway": 0.0, "jwks_min_interval": 0.5, **oauth},
        "admin": {"tokens": [{"token": ADMIN_TOKEN, "role": "admin"}]},
        "limits": {"handshake_timeout": 5.0},
    }
