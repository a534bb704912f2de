"""Loading the C fast path (``proxy/amqp/_fastpath.c``), and its stand-ins in Python.

The extension is optional (``pyproject.toml``): a node without it, or with
``FEDGATE_NO_FASTPATH`` set, runs the same steps in Python (``proxy.amqp.engine``
and the functions here), at about twice the CPU per proxied message.

``load`` gives the C module proton's functions by their addresses in
python-qpid-proton's own module (which exports them; ``ctypes`` finds them in
the library already loaded), python-qpid-proton's pointer types, and cffi's
conversion table, so that the pointers it takes and returns are the same cffi
objects the Python code uses.
"""

from __future__ import annotations

import ctypes
import logging
import os

import _cffi_backend
import cproton_ffi
from cproton import ffi as _ffi
from cproton import lib as _lib

log = logging.getLogger("fedgate.node")
RELAY_IN_PYTHON = object()  # fast_relay's answer for what relay_transfer must do itself
fastpath_off = bool(os.environ.get("FEDGATE_NO_FASTPATH"))
fastpath_loaded = False

_FUNCTIONS = ("pn_collector_peek", "pn_collector_pop", "pn_event_delivery", "pn_event_connection",
              "pn_event_type", "pn_delivery_link", "pn_delivery_partial", "pn_delivery_aborted",
              "pn_delivery_pending", "pn_link_recv", "pn_link_advance", "pn_delivery", "pn_link_send",
              "pn_delivery_remote_state", "pn_delivery_update", "pn_delivery_settle", "pn_link_current")
_POINTER_TYPES = ("pn_collector_t", "pn_event_t", "pn_delivery_t", "pn_link_t", "pn_connection_t")


def load(partial_sizes: dict, late_links: dict):
    """The set-up C module, or None (not built, or switched off).

    ``partial_sizes``: the engine's table of links with a partial transfer being
    counted; the C relay leaves those links' deliveries to Python. ``late_links``:
    links whose incomplete delivery's later frames are watched (the engine's
    ``late_links``); while there is one, the C relay leaves every delivery to Python.
    """
    global fastpath_loaded
    if fastpath_off:
        return None
    try:
        from proxy.amqp import _fastpath
    except ImportError:
        return None
    collector = None
    try:
        library = ctypes.CDLL(cproton_ffi.__file__)  # already loaded: the same handle
        addresses = tuple(ctypes.cast(getattr(library, name), ctypes.c_void_p).value for name in _FUNCTIONS)
        pointer_types = tuple(_ffi.typeof(f"{name} *") for name in _POINTER_TYPES)
        _fastpath.setup(_cffi_backend._C_API, addresses, pointer_types, partial_sizes, RELAY_IN_PYTHON,
                        late_links)
        # cffi's conversions as the module expects them, and a pump over an empty collector
        collector = _lib.pn_collector()
        back = _fastpath.roundtrip(collector)
        if back != collector or _ffi.typeof(back) is not _ffi.typeof(collector):
            raise ValueError("a pointer did not come back the same through cffi's conversions")
        _fastpath.pump(collector, None, "on_delivery", None, None)
    except (OSError, AttributeError, TypeError, ValueError, RuntimeError) as exc:
        log.warning("proxy.amqp._fastpath is built but cannot be used (%s): the Python path runs", exc)
        return None
    finally:
        if collector is not None:
            _lib.pn_collector_free(collector)
    fastpath_loaded = True
    return _fastpath


def relay_kept(link, delivery, target, tag: int, max_size: int = 0):
    """The C ``relay_kept``'s stand-in: the caller reads and sends the message itself."""
    return RELAY_IN_PYTHON


def settle_accepted(delivery, other) -> bool:
    """If ``delivery``'s peer accepted it: ``other`` (a delivery, or None: its pair on the
    other side of the proxy) accepted and settled, ``delivery`` settled, True. Else False,
    nothing done (AMQP 1.0 §3.4)."""
    if _lib.pn_delivery_remote_state(delivery) != _lib.PN_ACCEPTED:
        return False
    if other is not None:
        _lib.pn_delivery_update(other, _lib.PN_ACCEPTED)
        _lib.pn_delivery_settle(other)
    _lib.pn_delivery_settle(delivery)
    return True
