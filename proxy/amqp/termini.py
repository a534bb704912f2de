"""Terminus fields (§3.5.3): filter names and capabilities, read and written through proton."""

from __future__ import annotations

from proton import Data, symbol


def filter_names(terminus) -> set[str]:
    """The keys of a source's filter-set (§3.5.8), e.g. ``{"selector"}``."""
    data = terminus.filter
    data.rewind()
    if data.next() is None:
        return set()
    filters = data.get_object()
    return {str(name) for name in filters} if isinstance(filters, dict) else {"?"}


def set_capabilities(terminus, names: tuple[str, ...]) -> None:
    """Replace a terminus's capabilities with ``names`` (§3.5.3, an array of symbols)."""
    data = terminus.capabilities
    data.clear()
    data.put_array(False, Data.SYMBOL)
    data.enter()
    for name in names:
        data.put_symbol(symbol(name))
    data.exit()


def capability_names(terminus) -> set[str]:
    """A terminus's capabilities (§3.5.3): a symbol or an array of them."""
    data = terminus.capabilities
    data.rewind()
    if data.next() is None:
        return set()
    value = data.get_object()
    items = getattr(value, "elements", None)
    if items is None:
        items = value if isinstance(value, (list, tuple)) else (value,)
    return {str(item) for item in items}


SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_CODE = 0x0000468C00000004


def filters(terminus) -> dict:
    """A source's filter-set (§3.5.8): name -> (descriptor, value); ``{"?": (None, None)}``
    when it is not a map."""
    data = terminus.filter
    data.rewind()
    if data.next() is None:
        return {}
    found = data.get_object()
    if not isinstance(found, dict):
        return {"?": (None, None)}
    out = {}
    for name, value in found.items():
        descriptor = getattr(value, "descriptor", None)
        out[str(name)] = (descriptor, getattr(value, "value", value))
    return out


NO_LOCAL_FILTER = "apache.org:no-local-filter:list"
NO_LOCAL_CODE = 0x0000468C00000003


def is_no_local(descriptor) -> bool:
    """Whether a filter's descriptor is JMS no-local (a subscriber's own connection's messages
    are not for it; Qpid JMS sends it with an empty list)."""
    return descriptor == NO_LOCAL_CODE or str(descriptor) == NO_LOCAL_FILTER


def is_selector(descriptor) -> bool:
    """Whether a filter's descriptor names a JMS selector (by symbol or by code)."""
    return descriptor == SELECTOR_CODE or str(descriptor) == SELECTOR_FILTER
