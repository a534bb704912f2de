"""Transaction tests' client processes: proton-python's Transaction API (``tests/clients/proton_txn.py``)."""

from __future__ import annotations

import subprocess

from conftest import PYTHON, TESTS, ClientProcess

TXN_CLIENT = TESTS / "clients" / "proton_txn.py"


class TxnClient(ClientProcess):
    """``proton_txn.py MODE --url ... [options]`` (the same reading helpers as ClientProcess)."""

    def __init__(self, mode: str, url: str, **options) -> None:
        self.cmd = [PYTHON, str(TXN_CLIENT), mode, "--url", url]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            self.cmd += [flag] if value is True else [flag, str(value)]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0)
        self._pending = b""


def receive_plain(clients, url: str, address: str, count: int) -> list[dict]:
    """What a plain (not transactional) receiver takes from ``address``, one line per message."""
    lines = clients("python", "receive", url, address=address, count=count,
                    idle_ms=1500).finish()
    return [line for line in lines if "id" in line]
