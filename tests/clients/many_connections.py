"""Open N client connections, each sending one numbered message, and keep them open.

    python many_connections.py --url U --address A --count N

Prints {"open": N, "accepted": k} once every message is settled, then keeps
every connection open until a line arrives on stdin (or 120 s pass), then
closes them all and prints {"closed": N}.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector


class Many(MessagingHandler):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.accepted = 0
        self.settled = 0
        self.connections = []
        self.index = {}  # sender -> client number
        self.sent = set()
        self.injector = EventInjector()

    def on_start(self, event):
        event.container.selectable(self.injector)
        for i in range(self.args.count):
            conn = event.container.connect(self.args.url, reconnect=False, allowed_mechs="ANONYMOUS")
            sender = event.container.create_sender(conn, self.args.address)
            self.connections.append((conn, sender, i))
            self.index[sender] = i
        event.container.schedule(120, self)

    def on_sendable(self, event):
        i = self.index.get(event.sender)
        if i is not None and i not in self.sent:
            self.sent.add(i)
            event.sender.send(Message(id=f"c-{i}", body=f"client {i}",
                                      properties={"producer": f"c{i}", "seq": 0}))

    def on_settled(self, event):
        self.settled += 1
        if event.delivery.remote_state == event.delivery.ACCEPTED:
            self.accepted += 1
        if self.settled == self.args.count:
            print(json.dumps({"open": len(self.connections), "accepted": self.accepted}), flush=True)
            threading.Thread(target=self.wait_stdin, daemon=True).start()

    def wait_stdin(self):
        sys.stdin.readline()
        self.injector.trigger(ApplicationEvent("close_all"))

    def on_close_all(self, event):
        self.close_all()

    def on_timer_task(self, event):
        self.close_all()

    def close_all(self):
        for conn, _, _ in self.connections:
            conn.close()
        print(json.dumps({"closed": len(self.connections)}), flush=True)
        self.injector.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--count", type=int, default=100)
    args = parser.parse_args()
    Container(Many(args)).run()


if __name__ == "__main__":
    main()
