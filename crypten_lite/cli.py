"""The `crypten-lite` command: launch, party, dealer, certs, health, bench.

    crypten-lite launch -n 2 examples/private_inference.py     # local parties + dealer
    crypten-lite party script.py                              # one party (container entrypoint)
    crypten-lite dealer                                       # the dealer service
    crypten-lite certs --parties 2 --out certs                # CA + per-party certificates
    crypten-lite health --target host:port                    # gRPC health check
    crypten-lite bench [--only NAME]                          # benchmarks (JSON lines)
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import selectors
import signal
import subprocess
import sys
import time

DESCRIPTION = __doc__


def _launch(args: argparse.Namespace) -> int:
    from .mpc.launcher import local_env

    if args.n < 2:
        print("crypten-lite launch: -n must be at least 2 parties", file=sys.stderr)
        return 2
    if not os.path.exists(args.script):
        print(f"crypten-lite launch: no such script {args.script!r}", file=sys.stderr)
        return 2
    if args.provider == "tfp":
        print("crypten-lite launch: WARNING provider 'tfp' is insecure (party 0 plays dealer); "
              "use it for tests and debugging only", file=sys.stderr)
    extra = {}
    if args.tls_dir:
        extra["CRYPTEN_LITE_TLS_DIR"] = os.path.abspath(args.tls_dir)
    party_envs, dealer_env = local_env(args.n, args.provider, timeout=args.timeout, extra=extra)
    procs: list[tuple[str, subprocess.Popen]] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    base["PYTHONUNBUFFERED"] = "1"
    # Parties share this machine's cores: oversubscribed BLAS threads only slow everybody down.
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.n)))
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if args.provider == "dealer":
            procs.append(("dealer", subprocess.Popen(
                [sys.executable, "-m", "crypten_lite.cli", "dealer"], env={**base, **dealer_env}, **popen)))
        for rank, env in enumerate(party_envs):
            procs.append((f"rank {rank}", subprocess.Popen(
                [sys.executable, args.script, *args.args], env={**base, **env}, **popen)))
        return _supervise(procs, n_parties=args.n)
    finally:
        _stop_all([p for _, p in procs])


def _supervise(procs: list[tuple[str, subprocess.Popen]], n_parties: int) -> int:
    """Relay output prefixed by rank; stop everything at the first failure."""
    sel = selectors.DefaultSelector()
    for label, proc in procs:
        sel.register(proc.stdout, selectors.EVENT_READ, label)
    open_streams = len(procs)
    status = 0
    parties = [p for label, p in procs if label.startswith("rank")]
    while open_streams:
        for key, _ in sel.select(timeout=0.5):
            line = key.fileobj.readline()
            if not line:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            sys.stdout.write(f"[{key.data}] {line.decode(errors='replace')}")
            sys.stdout.flush()
        failed = [(label, p.returncode) for label, p in procs
                  if p.poll() is not None and p.returncode not in (0, None)
                  and not (label == "dealer" and p.returncode in (-signal.SIGTERM,))]
        if failed:
            label, code = failed[0]
            print(f"crypten-lite launch: {label} exited with code {code}; stopping the others",
                  file=sys.stderr)
            status = code if code > 0 else 1
            break
        if all(p.poll() is not None for p in parties):
            # Drain what is left, then stop the dealer.
            for key in list(sel.get_map().values()):
                if not key.data.startswith("rank"):
                    continue
                for line in key.fileobj:
                    sys.stdout.write(f"[{key.data}] {line.decode(errors='replace')}")
            break
    return status


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _party(args: argparse.Namespace) -> int:
    from .config import Config
    Config.from_env()  # fail early with a clear message on a bad environment
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")
    return 0


def _dealer(args: argparse.Namespace) -> int:
    from .comm.dealer_rpc import DealerServer
    from .config import Config
    from .provider import dealer_handler

    config = Config.from_env()
    server = DealerServer(config, dealer_handler, address=args.listen)
    logging.getLogger("crypten_lite").info("dealer listening")
    print(f"dealer: serving session {config.session!r} for {config.world_size} parties", flush=True)

    def stop(*_):
        server.stop()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    server.wait()
    return 0


def _health(args: argparse.Namespace) -> int:
    from .comm.health import check
    ok, detail = check(args.target, args.timeout)
    print(detail)
    return 0 if ok else 1


def _certs(argv: list[str]) -> int:
    from . import certs
    return certs.main(argv)


def _bench(argv: list[str]) -> int:
    from .bench import main
    return main(argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crypten-lite", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("launch", help="run a script as N local parties plus the dealer")
    p.add_argument("-n", type=int, default=2, help="number of parties (default 2)")
    p.add_argument("--provider", choices=("dealer", "tfp"), default="dealer",
                   help="correlated randomness: dealer (secure, default) or tfp (INSECURE)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    p.add_argument("--tls-dir", default="", help="certificates from `crypten-lite certs`")
    p.add_argument("script", help="Python script calling crypten_lite.init()")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(fn=_launch)
    p = sub.add_parser("party", help="run one party of a session configured by CRYPTEN_LITE_*",
                       description="Run SCRIPT as one party of a session. The session comes from the "
                                   "environment (CRYPTEN_LITE_RANK, CRYPTEN_LITE_WORLD_SIZE, "
                                   "CRYPTEN_LITE_PARTIES, CRYPTEN_LITE_DEALER, CRYPTEN_LITE_TLS_DIR, ... "
                                   "or CRYPTEN_LITE_CONFIG); the script calls crypten_lite.init(). "
                                   "This is the container entrypoint; see docs/deployment.md.")
    p.add_argument("script", help="Python script calling crypten_lite.init()")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed on to the script")
    p.set_defaults(fn=_party)
    p = sub.add_parser("dealer", help="run the dealer service configured by CRYPTEN_LITE_*")
    p.add_argument("--listen", default=None, help="bind address (default CRYPTEN_LITE_DEALER)")
    p.set_defaults(fn=_dealer)
    p = sub.add_parser("health", help="gRPC health check of a party or the dealer")
    p.add_argument("--target", required=True,
                   help="host:port of a party or the dealer (with CRYPTEN_LITE_TLS_DIR: over mutual TLS)")
    p.add_argument("--timeout", type=float, default=3.0,
                   help="seconds to wait for the answer before reporting the target unhealthy "
                        "(default %(default)s)")
    p.set_defaults(fn=_health)
    sub.add_parser("certs", help="create a CA and per-party certificates (see certs --help)", add_help=False)
    sub.add_parser("bench", help="run the benchmark suite (see bench --help)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("CRYPTEN_LITE_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if argv and argv[0] == "certs":
        return _certs(argv[1:])
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
