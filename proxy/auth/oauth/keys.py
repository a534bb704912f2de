"""The keys tokens are checked against: PEM files, and a JWKS URL kept fresh.

How this works
--------------
``KeySet.candidates(kid)`` is synchronous; a SASL login whose kid is missing
waits for the refetch that the miss started (``fetching``; the connection polls,
``proxy.auth.mechanisms.Wait``). PEM keys are loaded once; their ``kid`` is the file name without
``.pem``. A JWKS document is fetched by ``start`` (a failure is logged; the
node serves on and tokens are refused ``unknown_key`` until a fetch succeeds),
then every ``refresh`` seconds, and when ``find`` misses a ``kid`` (the
provider may have rotated its keys). Fetches are rate-limited: a new one
starts only ``min_interval`` seconds after the last began, however many
unknown kids arrive. A fetch times out after ``FETCH_TIMEOUT`` and a document
over ``MAX_JWKS_BYTES`` is refused. Symmetric keys (``kty = oct``) and
encryption keys (``use = enc``) are never taken.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from pathlib import Path

import orjson
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from jwt import PyJWK
from jwt.exceptions import PyJWKError

log = logging.getLogger("fedgate.oauth")

FETCH_TIMEOUT = 10.0
MAX_JWKS_BYTES = 1 << 20


class KeyFileError(ValueError):
    """A key file named in ``[oauth]`` that is missing or holds no public key (``key``: its config key)."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"{key}: {detail}")
        self.key = key
        self.detail = detail


def load_pem(path: Path):
    """A public key from a PEM file: a public key, or a certificate's."""
    data = Path(path).read_bytes()
    if b"CERTIFICATE" in data:
        return x509.load_pem_x509_certificate(data).public_key()
    return serialization.load_pem_public_key(data)


def keys_from_jwks(document: dict) -> dict[str, object]:
    """``{kid: public key}`` of the usable signing keys of a JWKS document."""
    found = {}
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError("a JWKS document needs a 'keys' list")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("kty") == "oct" or entry.get("use", "sig") != "sig":
            continue
        try:
            jwk = PyJWK(entry)
        except (PyJWKError, ValueError, TypeError, KeyError) as exc:
            log.info("JWKS key %d skipped: %s", index, exc)
            continue
        kid = entry.get("kid")
        found[kid if isinstance(kid, str) else ""] = jwk.key
    return found


class KeySet:
    def __init__(self, pem: dict[str, object] | None = None, jwks_url: str | None = None, *,
                 refresh: float = 300.0, min_interval: float = 10.0, ca: str | None = None,
                 clock=time.monotonic) -> None:
        self.static = dict(pem or {})
        self.jwks_url = jwks_url
        self.fetched: dict[str, object] = {}
        self.refresh = refresh
        self.min_interval = min_interval
        self.ca = ca
        self.clock = clock
        self.fetches: Counter = Counter()  # result -> count ("ok", "failed", "rate_limited")
        self._last_start: float | None = None
        self._task: asyncio.Task | None = None
        self._periodic: asyncio.Task | None = None

    @classmethod
    def from_config(cls, section, resolve=Path) -> "KeySet":
        pem = {}
        for index, name in enumerate(section.keys):
            try:
                pem[Path(name).name.removesuffix(".pem")] = load_pem(resolve(name))
            except (OSError, ValueError, TypeError) as exc:  # missing, unreadable, not a public key
                raise KeyFileError(f"oauth.keys[{index}]", f"{resolve(name)}: {exc}") from None
        if section.jwks_ca and not Path(resolve(section.jwks_ca)).is_file():
            raise KeyFileError("oauth.jwks_ca", f"file {resolve(section.jwks_ca)} not found")
        return cls(pem, section.jwks_url, refresh=section.jwks_refresh,
                   min_interval=section.jwks_min_interval,
                   ca=str(resolve(section.jwks_ca)) if section.jwks_ca else None)

    # -- lookup ----------------------------------------------------------------
    def candidates(self, kid: str | None) -> list:
        """The keys a token with this ``kid`` may be checked against (none: ask for a refetch)."""
        if kid is not None:
            key = self.fetched.get(kid, self.static.get(kid))
            if key is None:
                self.request_fetch()
                return []
            return [key]
        every = list(self.static.values()) + list(self.fetched.values())
        return every if len(every) == 1 else []  # no kid: only when there is one key

    # -- fetching ----------------------------------------------------------------
    async def start(self) -> None:
        if self.jwks_url is None:
            return
        await self.fetch_now()
        self._periodic = asyncio.get_running_loop().create_task(self._every_refresh())

    async def stop(self) -> None:
        for task in (self._periodic, self._task):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass

    @property
    def fetching(self) -> bool:
        """A refetch (started by an unknown kid) is under way."""
        return self._task is not None and not self._task.done()

    def request_fetch(self) -> None:
        """Start a fetch unless one started less than ``min_interval`` ago (or none can run)."""
        if self.jwks_url is None:
            return
        now = self.clock()
        if (self._task is not None and not self._task.done()) or (
                self._last_start is not None and now - self._last_start < self.min_interval):
            self.fetches["rate_limited"] += 1
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._task = loop.create_task(self.fetch_now())

    async def _every_refresh(self) -> None:
        while True:
            await asyncio.sleep(max(self.refresh, 1.0))
            await self.fetch_now()

    async def fetch_now(self) -> bool:
        import aiohttp

        self._last_start = self.clock()
        context = ssl.create_default_context(cafile=self.ca) if self.ca else None
        try:
            timeout = aiohttp.ClientTimeout(total=FETCH_TIMEOUT)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(self.jwks_url, ssl=context if context else True) as response:
                    if response.status != 200:
                        raise ValueError(f"HTTP {response.status}")
                    body = await response.content.read(MAX_JWKS_BYTES + 1)
                    if len(body) > MAX_JWKS_BYTES:
                        raise ValueError(f"JWKS document over {MAX_JWKS_BYTES} bytes")
            keys = keys_from_jwks(orjson.loads(body))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure: keep the keys we have
            self.fetches["failed"] += 1
            log.warning("JWKS fetch from %s failed: %s", self.jwks_url, exc or type(exc).__name__)
            return False
        self.fetches["ok"] += 1
        if set(keys) != set(self.fetched):
            log.info("JWKS from %s: keys %s", self.jwks_url, ", ".join(sorted(keys)) or "(none)")
        self.fetched = keys
        return True
