"""The ``fedgate`` command: serve, check-config, users."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys

from proxy import plugins
from proxy.auth.users import UsersFile, UsersFileError, make_record
from proxy.config import settings as config_mod
from proxy.config.errors import ConfigError
from proxy.config.version import version

log = logging.getLogger("fedgate")


def _load_config(path: str | None, **overrides) -> config_mod.Config:
    config = config_mod.load(path) if path else config_mod.from_dict({})
    return config_mod.apply_overrides(config, **overrides)


# The collector's thresholds for a serving node: a node holds millions of long-lived objects
# (a message and, paged, its page record each) and allocates a few per message; with the
# default (700, 10, 10) generation-0 and -1 passes ran every few hundred messages. Measured
# (bench/paging.py's two steps, 500,000 messages of 1 KB, 2 cores): in memory, drain 92k ->
# 126k msg/s; paging, fill 34k -> 42k and drain 56k -> 76k msg/s. Reference cycles are
# still collected, a little later.
GC_THRESHOLDS = (100_000, 50, 1000)


async def _serve(config: config_mod.Config, worker=None) -> int:
    from proxy.node import build_node

    gc.set_threshold(*GC_THRESHOLDS)
    # plug-ins register what they serve before the listener accepts anyone
    node = build_node(config, worker=worker)
    try:
        await node.start()
        if worker is None:
            print(f"fedgate node {node.node_id} listening on {node.url}", flush=True)
        else:  # the supervisor says where the node listens, once every worker is ready
            worker.send(b"R", "")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("signal received, shutting down")
    finally:
        await node.stop()
    return 0


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The command-line overrides a worker process gets from ``fedgate serve``."""
    passed = []
    for flag in ("config", "admin", "node_id", "data_dir", "log_level", "advertise",
                 "advertise_admin"):
        value = getattr(args, flag, None)
        if value is not None:
            passed += [f"--{flag.replace('_', '-')}", value]
    return passed


def cmd_serve(args: argparse.Namespace) -> int:
    config = _load_config(
        args.config, listen=args.listen, admin=args.admin, node_id=args.node_id,
        data_dir=args.data_dir, log_level=args.log_level, workers=args.workers,
        advertise=args.advertise, advertise_admin=args.advertise_admin,
    )
    logging.basicConfig(
        level=config.node.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from proxy.cluster import CoordinatorError
    from proxy.config import compat
    from proxy.journal.journal import JournalError

    workers = config_mod.worker_count(config.node.workers)
    try:  # a data dir a newer release wrote is refused before anything in it is opened
        compat.check_data_dir(config.node.data_dir)
    except (compat.DataDirRefused, OSError) as exc:
        print(f"fedgate: {exc}", file=sys.stderr)
        return 1
    try:
        if workers > 1:
            from proxy.workers import supervisor

            return asyncio.run(supervisor.run(config, workers, _passed_on(args)))
        return asyncio.run(_serve(config))
    except JournalError as exc:  # e.g. the data dir's journal is another node's, or newer
        print(f"fedgate {version()}: {exc}", file=sys.stderr)
        return 1
    except CoordinatorError as exc:  # etcd unreachable at start, or our node id is taken
        print(f"fedgate: cluster: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"fedgate: cannot listen on {config.node.listen}: {exc}", file=sys.stderr)
        return 1


def cmd_worker(args: argparse.Namespace) -> int:
    """One worker process of a node (started by ``fedgate serve`` with workers > 1)."""
    import os
    import socket
    from pathlib import Path

    from proxy.journal.journal import JournalError
    from proxy.workers.ownership import QueueOwners
    from proxy.workers.worker import WorkerContext

    config = _load_config(args.config, listen=args.listen, admin=args.admin, node_id=args.node_id,
                          data_dir=args.data_dir, log_level=args.log_level,
                          advertise=args.advertise, advertise_admin=args.advertise_admin)
    from proxy.config.compat import worker_release_problem

    problem = worker_release_problem(os.environ)
    if problem is not None:
        print(f"fedgate: worker {args.index}: {problem}", file=sys.stderr)
        return 1
    logging.basicConfig(
        level=config.node.log_level.upper(),
        format=f"%(asctime)s %(levelname)s w{args.index} %(name)s: %(message)s",
    )
    # every local queue has one owner, the supervisor's answer for its name
    # (proxy.workers.ownership); exchanges and dead-lettering reach queues on other workers
    # through internal senders
    worker = WorkerContext(
        index=args.index, count=args.count, data_dir=Path(config.node.data_dir).absolute(),
        owners=QueueOwners(config.node.id, args.count),
        channel=socket.socket(fileno=args.channel_fd),
        owner_channel=socket.socket(fileno=args.owners_fd) if args.owners_fd is not None else None,
        admin_token=os.environ.pop("FEDGATE_WORKER_TOKEN", ""))
    if worker.owner_channel is not None:
        worker.owners.ask = worker.ask_owner
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which stops us
    from proxy.cluster import CoordinatorError

    try:
        return asyncio.run(_serve(config, worker=worker))
    except JournalError as exc:
        print(f"fedgate {version()}: worker {args.index}: {exc}", file=sys.stderr)
        return 1
    except CoordinatorError as exc:
        print(f"fedgate: worker {args.index}: cluster: {exc}", file=sys.stderr)
        return 1


def cmd_check_config(args: argparse.Namespace) -> int:
    config = config_mod.load(args.file)
    if not args.no_files:  # files the config names must exist and load
        from proxy.config.oauth import oauth_validator
        from proxy.node import build_tls_context

        named = [("sasl.users_file", config.sasl.users_file)]
        if config.tls is not None:
            named += [("tls.cert", config.tls.cert), ("tls.key", config.tls.key), ("tls.ca", config.tls.ca)]
        for key, path in named:
            if path and not config.resolve_path(path).is_file():
                raise ConfigError(key, f"file {config.resolve_path(path)} not found "
                                       "(--no-files checks the config alone)")
        build_tls_context(config)
        oauth_validator(config)  # [oauth] keys: PEM files load, jwks_ca exists
        if config.sasl.users_file:
            UsersFile.load(config.resolve_path(config.sasl.users_file))
    rules = config.ruleset()
    print(f"{args.file}: ok (node {config.node.id}, {len(rules.rules)} rules, "
          f"{len(config.peers)} peers)")
    return 0


def cmd_users(args: argparse.Namespace) -> int:
    users = UsersFile.load(args.file, missing_ok=args.action == "add")
    if args.action == "add":
        if args.password_stdin:
            password = sys.stdin.readline().rstrip("\n")
        else:
            import getpass

            password = getpass.getpass(f"password for {args.name}: ")
        groups = tuple(g for g in (args.groups or "").split(",") if g)
        users.add(make_record(args.name, password, groups=groups))
        users.save()
        print(f"user {args.name} saved to {args.file}")
    elif args.action == "remove":
        if not users.remove(args.name):
            print(f"fedgate: no user {args.name!r} in {args.file}", file=sys.stderr)
            return 1
        users.save()
        print(f"user {args.name} removed")
    else:
        for name, record in sorted(users.users.items()):
            groups = f" groups={','.join(record.groups)}" if record.groups else ""
            print(f"{name}{groups}")
    return 0


def _workers_flag(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f'a number or "auto", not {value!r}') from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedgate", description="AMQP 1.0 federation proxy node")
    parser.add_argument("--version", action="version", version=f"fedgate {version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a node")
    serve.add_argument("--config", help="TOML config file")
    serve.add_argument("--listen", help="HOST:PORT for AMQP (default 127.0.0.1:5672)")
    serve.add_argument("--admin", help="HOST:PORT for the admin API (default 127.0.0.1:8080)")
    serve.add_argument("--node-id", help="this node's id")
    serve.add_argument("--data-dir", help="directory for the node's state")
    serve.add_argument("--log-level", choices=config_mod.LOG_LEVELS)
    serve.add_argument("--workers", type=_workers_flag,
                       help='worker processes behind the one listener: a number or "auto" (one per core)')
    serve.add_argument("--advertise", help="[cluster] advertise: the AMQP URL other nodes and "
                                           "clients reach this node by")
    serve.add_argument("--advertise-admin", help="[cluster] advertise_admin: this node's admin URL "
                                                 "as others reach it")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("_worker")  # started by serve --workers N; not for people
    for flag in ("--config", "--listen", "--admin", "--node-id", "--data-dir", "--advertise",
                 "--advertise-admin"):
        worker.add_argument(flag)
    worker.add_argument("--log-level", choices=config_mod.LOG_LEVELS)
    worker.add_argument("--index", type=int, required=True)
    worker.add_argument("--count", type=int, required=True)
    worker.add_argument("--channel-fd", type=int, required=True)
    worker.add_argument("--owners-fd", type=int)
    worker.set_defaults(func=cmd_worker)

    check = sub.add_parser("check-config", help="validate a config file without serving")
    check.add_argument("file")
    check.add_argument("--no-files", action="store_true",
                       help="check the config alone, not the certificate and users files it names")
    check.set_defaults(func=cmd_check_config)

    users = sub.add_parser("users", help="manage a users file (salted hashes)")
    users_sub = users.add_subparsers(dest="action", required=True)
    add = users_sub.add_parser("add")
    add.add_argument("name")
    add.add_argument("--file", required=True)
    add.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.add_argument("--groups", help="comma-separated groups (for ACLs)")
    remove = users_sub.add_parser("remove")
    remove.add_argument("name")
    remove.add_argument("--file", required=True)
    listing = users_sub.add_parser("list")
    listing.add_argument("--file", required=True)
    users.set_defaults(func=cmd_users)
    for register in plugins.load("fedgate.commands"):
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"fedgate: config error: {exc}", file=sys.stderr)
        return 2
    except (UsersFileError, OSError) as exc:
        print(f"fedgate: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
