"""What this release speaks to other nodes and reads from disk: versions, features, the
data dir's marker (docs/upgrades.md, issue #46's rolling upgrades).

How this works
--------------
* A node announces its ``version`` (``proxy.config.version``) and ``FEATURES`` (names):
  in its etcd member record, and in the attach properties of its replication links. A
  peer that announces nothing is the previous release, 0.5.0, which had ``BASELINE``.
  ``negotiate`` gives what two sides both have; a feature outside it is not used on that
  link (``cluster_lacks``: not used cluster-wide while a live member lacks it).
* Replication batches are numbered (``proxy.replication.events``): ``BATCH_VERSIONS`` are
  those this node reads, ``batch_version`` the one to send to a peer.
* The data dir carries one marker, ``<data_dir>/FORMAT``: ``{"data_format", "written_by"}``.
  ``check_data_dir`` reads it at start (none: a 0.5.0 dir or a new one, data format 1),
  refuses a greater ``data_format`` than ``DATA_FORMAT`` with ``DataDirRefused`` naming
  both versions, and writes the marker with this release's version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .version import version

PREVIOUS = "0.5.0"  # the release this one works with in one cluster
# what 0.5.0 had (it announced nothing): replication batches of version 1
BASELINE = frozenset({"replication-batch-1"})
# this release: wiring = run-time exchanges, bindings and queues (the `wiring` record);
# versioned = announces its version and features (member record, attach properties);
# fragment-selectors = its fragments serve stealers with a JMS selector (0.5.0 refuses them)
FEATURES = frozenset(BASELINE | {"versioned", "wiring", "fragment-selectors"})
BATCH_VERSIONS = (1,)  # replication batch versions this node reads (0.5.0's: 1)

DATA_FORMAT = 1  # what this release writes in the data dir; 0.5.0's unmarked dir is 1
READS_DATA_FORMATS = (1,)
FORMAT_FILE = "FORMAT"
SUPERVISOR_VERSION = "FEDGATE_SUPERVISOR_VERSION"  # the env a supervisor gives its workers
MEMBER_FORMAT = 1  # the etcd member record's `format` (0.5.0's has none: read as 0)


def features_of(announced) -> frozenset[str]:
    """A peer's features: what it announced, else (nothing announced) 0.5.0's."""
    if announced is None:
        return BASELINE
    try:
        return frozenset(str(item) for item in announced)
    except TypeError:
        return BASELINE


def negotiate(ours, theirs) -> frozenset[str]:
    """The features both sides have: the only ones used on the link between them."""
    return frozenset(ours) & frozenset(theirs)


def batch_version(common) -> int:
    """The replication batch version to send, given the negotiated features."""
    return max((n for n in BATCH_VERSIONS if f"replication-batch-{n}" in common), default=1)


def cluster_lacks(feature: str, members) -> list:
    """Live members (``proxy.cluster.Member``) without ``feature``: while any, it is not used.
    A member of unknown version (a static peer: nothing registered) is not counted."""
    return [m for m in members if m.version and
            feature not in features_of(getattr(m, "features", None))]


def version_key(text: str) -> tuple:
    parts = []
    for piece in str(text).split("."):
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class DataDirRefused(Exception):
    """The data dir was written by a release whose on-disk formats this one does not read."""


def check_data_dir(data_dir: str | os.PathLike, *, write: bool = True) -> dict:
    """Read the data dir's marker (none: 0.5.0's or a new dir), refuse a newer format, write
    ours. Answers what was found: ``{"data_format", "written_by", "marked"}``."""
    path = Path(data_dir) / FORMAT_FILE
    found = {"data_format": 1, "written_by": PREVIOUS, "marked": False}
    try:
        body = json.loads(path.read_text())
        found = {"data_format": int(body["data_format"]),
                 "written_by": str(body.get("written_by", "unknown")), "marked": True}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataDirRefused(f"the data dir {data_dir} has a marker {path} this fedgate "
                            f"{version()} cannot read ({exc}): refused") from None
    if found["data_format"] not in READS_DATA_FORMATS:
        raise DataDirRefused(
            f"the data dir {data_dir} was written by fedgate {found['written_by']} (data format "
            f"{found['data_format']}); this is fedgate {version()}, which reads data formats "
            f"up to {max(READS_DATA_FORMATS)}: a downgrade is refused (start fedgate "
            f"{found['written_by']} or later on it, or give this node an empty data dir)")
    if write:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        body = {"data_format": DATA_FORMAT, "written_by": version()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, sort_keys=True) + "\n")
        os.replace(tmp, path)
    return found


def worker_release_problem(environ) -> str | None:
    """Why a worker process may not run under the supervisor that started it: the worker
    channels carry no version, so both must be one release (docs/upgrades.md)."""
    supervisor = environ.get(SUPERVISOR_VERSION)
    if supervisor == version():
        return None
    return (f"this worker runs fedgate {version()}, its supervisor fedgate "
            f"{supervisor or 'older than 0.6.0'}: a node's processes must be one release "
            "(the package was replaced under a running node?); restart the node")
