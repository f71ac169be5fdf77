"""The `crypten-lite` command: launch, party, dealer, certs, health, bench.

    crypten-lite launch -n 2 examples/private_inference.py     # local parties + dealer
    crypten-lite launch -n 3 --protocol rss script.py         # 3 parties, replicated, no dealer
    crypten-lite party script.py                              # one party (container entrypoint)
    crypten-lite dealer                                       # the dealer service
    crypten-lite certs --parties 2 --out certs                # CA + per-party certificates
    crypten-lite health --target host:port                    # gRPC health check
    crypten-lite bench [--only NAME]                          # benchmarks (JSON lines)
    crypten-lite serve --model lenet                          # prediction service (docs/serving.md)
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

DESCRIPTION = __doc__
# crypten_lite.config.PROTOCOLS (not imported here: `crypten-lite health` must stay light).
PROTOCOL_CHOICES = ("additive", "rss")
PROVIDER_CHOICES = ("dealer", "pairwise", "tfp")


def _launch(args: argparse.Namespace) -> int:
    from .mpc.launcher import PROTOCOL_ENV, inherited_settings, local_env
    from .session import REPORT_FILE_ENV

    if args.n < 2:
        print("crypten-lite launch: -n must be at least 2 parties", file=sys.stderr)
        return 2
    protocol = args.protocol or os.environ.get(PROTOCOL_ENV) or "additive"
    if protocol not in PROTOCOL_CHOICES:
        print(f"crypten-lite launch: {PROTOCOL_ENV}={protocol!r} is not one of "
              f"{', '.join(PROTOCOL_CHOICES)}", file=sys.stderr)
        return 2
    if protocol == "rss" and args.n != 3:
        print(f"crypten-lite launch: --protocol rss (replicated secret sharing) runs exactly 3 "
              f"parties, got -n {args.n}: use -n 3, or --protocol additive for {args.n} parties",
              file=sys.stderr)
        return 2
    if protocol == "rss" and args.provider is not None:
        print("crypten-lite launch: --provider chooses the additive protocol's correlated "
              "randomness; --protocol rss needs none (no dealer, no TFP): drop --provider",
              file=sys.stderr)
        return 2
    chosen = "--provider pairwise" if args.provider else "CRYPTEN_LITE_PROVIDER=pairwise"
    args.provider = args.provider or os.environ.get("CRYPTEN_LITE_PROVIDER") or "dealer"
    if args.provider not in PROVIDER_CHOICES:
        print(f"crypten-lite launch: CRYPTEN_LITE_PROVIDER={args.provider!r} is not one of "
              f"{', '.join(PROVIDER_CHOICES)}: set it to one of them, or unset it for the "
              "dealer", file=sys.stderr)
        return 2
    if args.provider == "pairwise" and args.n != 2:
        rss = " or --protocol rss (3 parties, no dealer either)" if args.n == 3 else ""
        print(f"crypten-lite launch: {chosen} (no dealer: the two parties make the correlations "
              f"with homomorphic encryption and OT) runs exactly 2 parties, got -n {args.n}: use -n 2, or for {args.n} "
              f"parties the dealer provider (--provider dealer){rss}", file=sys.stderr)
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
    # The pairwise offline progress line: the parties' stderr is a pipe to this launcher, so
    # they draw it when asked (--progress, CRYPTEN_LITE_PROGRESS) or when ours is a terminal.
    progress = "1" if args.progress else os.environ.get("CRYPTEN_LITE_PROGRESS", "")
    if not progress and args.provider == "pairwise" and sys.stderr.isatty():
        progress = "1"
    if progress:
        extra["CRYPTEN_LITE_PROGRESS"] = progress
    # The pairwise offline store (offline.make_store / prefetch): '{rank}' in the paths keeps
    # the two local parties' stores and keys apart.
    for name in ("CRYPTEN_LITE_OFFLINE_STORE", "CRYPTEN_LITE_OFFLINE_KEY"):
        if os.environ.get(name):
            extra[name] = os.environ[name]
    party_envs, dealer_env = local_env(args.n, args.provider, timeout=args.timeout, extra=extra,
                                       protocol=protocol)
    passed = {k: v for k, v in inherited_settings().items() if k not in extra}
    if passed:
        print("crypten-lite launch: every party gets from this environment: "
              + ", ".join(f"{k}={v}" for k, v in sorted(passed.items())), file=sys.stderr)
    children: list[_Child] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    base["PYTHONUNBUFFERED"] = "1"
    # Parties share this machine's cores: oversubscribed BLAS threads only slow everybody down.
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.n)))
    popen = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 start_new_session=True)
    reports = tempfile.mkdtemp(prefix="crypten-lite-launch-")
    previous_sigterm = signal.signal(signal.SIGTERM, _terminated)
    try:
        if dealer_env is not None and args.provider == "dealer":  # none under rss
            children.append(_Child("dealer", None, subprocess.Popen(
                [sys.executable, "-m", "crypten_lite.cli", "dealer"], env={**base, **dealer_env},
                **popen)))
        for rank, env in enumerate(party_envs):
            report = os.path.join(reports, f"rank-{rank}.json")
            children.append(_Child(f"rank {rank}", rank, subprocess.Popen(
                [sys.executable, args.script, *args.args],
                env={**base, **env, REPORT_FILE_ENV: report}, **popen), report))
        return _supervise(children)
    finally:
        _stop_all(children)
        signal.signal(signal.SIGTERM, previous_sigterm)
        shutil.rmtree(reports, ignore_errors=True)


# Seconds the other parties get to stop by themselves once a party has failed (the session's
# abort makes them fail at once; this only bounds a party busy in local computation).
GRACE = 10.0
_OUTPUT = threading.Lock()
_CHAINED = ("During handling of the above exception, another exception occurred:",
            "The above exception was the direct cause of the following exception:")
_LINE_END = re.compile(rb"\r\n|\r|\n")


class _Terminated(Exception):
    """crypten-lite launch itself received SIGTERM."""


def _terminated(*_) -> None:
    raise _Terminated()


class _Child:
    """One launched process: a thread per output pipe relays its lines, prefixed."""

    def __init__(self, label: str, rank: int | None, proc: subprocess.Popen, report: str = ""):
        self.label, self.rank, self.proc, self.report = label, rank, proc, report
        self.signalled = False
        self.stderr: collections.deque[str] = collections.deque(maxlen=20_000)
        self.last = ""  # its last line of output, either pipe
        self.exited_at = float("inf")  # when its exit was seen (a thread waits for it)
        self.threads = [threading.Thread(target=self._pump, args=(pipe, out, keep), daemon=True)
                        for pipe, out, keep in ((proc.stdout, sys.stdout, False),
                                                (proc.stderr, sys.stderr, True))]
        for t in self.threads:
            t.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited_at = time.monotonic()

    def _emit(self, out, text: str, keep: bool) -> None:
        with _OUTPUT:
            out.write(f"[{self.label}] {text}\n")
            out.flush()
            if text.strip():
                self.last = text
        if keep:
            self.stderr.append(text)

    def _pump(self, pipe, out, keep: bool) -> None:
        """Relay `pipe` until EOF. A carriage return ends a line too: progress bars redraw
        with '\\r', which would make one endless line; at most one redraw a second is shown
        (the last, which ends with '\\n', always)."""
        fd, pending, shown = pipe.fileno(), b"", 0.0
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending += chunk
            start = 0
            for m in _LINE_END.finditer(pending):
                if m.group() == b"\r" and m.end() == len(pending):
                    break  # maybe the first half of "\r\n": decide with the next chunk
                text = pending[start:m.start()].decode(errors="replace")
                start = m.end()
                if m.group() == b"\r":  # a redraw: show it at most once a second
                    if text.strip() and time.monotonic() - shown >= 1.0:
                        shown = time.monotonic()
                        self._emit(out, text.rstrip(), keep=False)
                    continue
                self._emit(out, text, keep)
            pending = pending[start:]
        if pending.strip(b"\r"):
            self._emit(out, pending.strip(b"\r").decode(errors="replace"), keep)
        pipe.close()

    def join(self, timeout: float) -> bool:
        """Wait until both pipes reached EOF (every line relayed); False if still open."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)

    @property
    def stopped(self) -> bool:
        """Ended by the launcher's signal, not by itself."""
        code = self.proc.returncode
        # The dealer's SIGTERM handler makes it exit 0.
        return self.signalled and (code in (-signal.SIGTERM, -signal.SIGKILL)
                                   or (self.rank is None and code == 0))

    @property
    def failed(self) -> bool:
        code = self.proc.returncode
        return code not in (None, 0) and not self.stopped

    def origin(self) -> int | None:
        """Rank of the party this one's failure follows from, as the party reported it."""
        try:
            with open(self.report) as f:
                return int(json.load(f)["origin"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def exit_text(self) -> str:
        code = self.proc.returncode
        if code is not None and code < 0:
            try:
                return f"exited with code {code} ({signal.Signals(-code).name})"
            except ValueError:
                pass
        return f"exited with code {code}"

    def traceback(self) -> list[str]:
        """The last traceback it printed (with the exceptions chained to it), or the last
        short report of an uncaught crypten_lite error (crypten_lite.errors.report_uncaught)."""
        lines = list(self.stderr)
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        short = [i for i, line in enumerate(lines) if line.startswith("crypten_lite: stopped")]
        if short and (not starts or short[-1] > starts[-1]):
            return lines[short[-1]:]
        if not starts:
            return []
        k = len(starts) - 1
        while k > 0:
            j = starts[k] - 1
            while j >= 0 and not lines[j].strip():
                j -= 1
            if j < 0 or lines[j] not in _CHAINED:
                break
            k -= 1
        return lines[starts[k]:]


def _supervise(children: list[_Child]) -> int:
    """Relay output prefixed by rank; at the first failure let the other parties stop (their
    sessions fail at once), stop what is left, and report the party that failed first."""
    parties = [c for c in children if c.rank is not None]
    failures: list[_Child] = []
    failed_at = None
    interrupted = ""
    # SIGINT sets a flag that the loop polls, rather than raising KeyboardInterrupt at any
    # point (inside Popen.poll or a lock, where an asynchronous exception can leave the
    # launcher stuck): seen once beside a CPU hog, the launcher never exited after SIGINT.
    sigint = threading.Event()
    previous_sigint = signal.signal(signal.SIGINT, lambda *_: sigint.set())
    try:
        while not all(c.proc.poll() is not None for c in parties):
            if sigint.is_set():
                raise KeyboardInterrupt
            for c in children:
                if c.proc.poll() is not None and c.failed and c not in failures:
                    failures.append(c)
            if failures and failed_at is None:
                failed_at = time.monotonic()
                # A party that failed before joining the session (an import error, a bad
                # argument) could not tell the others: stop them now.
                if failures[0].origin() is None and failures[0].rank is not None \
                        and failures[0].proc.returncode > 0:
                    break
            if failed_at is not None and time.monotonic() - failed_at > GRACE:
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = "interrupted (SIGINT)"
    except _Terminated:
        interrupted = "terminated (SIGTERM)"
    _stop_all(children)
    complete = [c.join(timeout=10.0) for c in children]
    signal.signal(signal.SIGINT, previous_sigint)
    if sigint.is_set() and not interrupted:
        interrupted = "interrupted (SIGINT)"
    for c in children:
        if c.failed and c not in failures:
            failures.append(c)
    return _report(children, failures, interrupted, complete)


def _report(children: list[_Child], failures: list[_Child], interrupted: str,
            complete: list[bool]) -> int:
    def say(text: str) -> None:
        print(f"crypten-lite launch: {text}", file=sys.stderr, flush=True)

    for c, done in zip(children, complete):
        if not done:
            say(f"the output of {c.label} may be incomplete (a process it started still holds it)")
    stopped = [c.label for c in sorted(children, key=lambda c: (c.rank is None, c.rank or 0))
               if c.stopped and (c.rank is not None or failures or interrupted)]
    party_failures = [c for c in failures if c.rank is not None] + [c for c in failures if c.rank is None]
    if interrupted and not party_failures:
        say(f"{interrupted}; stopped {', '.join(stopped) or 'nothing (all had exited)'}")
        return 130 if "SIGINT" in interrupted else 143
    if not party_failures:
        return 0
    by_rank = {c.rank: c for c in children if c.rank is not None}

    def cause(c: _Child) -> int:
        """0: certainly a cause (it reported its own failure, or a signal killed it); 1: it
        exited with an error without saying why; 2: it says it failed because of another."""
        origin = c.origin()
        if origin == c.rank or (origin is None and c.proc.returncode < 0):
            return 0
        return 1 if origin is None else 2

    party_failures.sort(key=lambda c: (cause(c), c.exited_at))
    first = party_failures[0]
    if cause(first) == 2:  # every failure says it follows from another party's
        first = by_rank.get(first.origin(), first)
    code = first.proc.returncode or 1
    say(f"{first.label} failed first: {first.exit_text()}")
    lines = first.traceback()
    if lines:
        with _OUTPUT:
            for line in lines:
                print(f"[{first.label}] {line}", file=sys.stderr)
            sys.stderr.flush()
    for c in party_failures:
        if c is first:
            continue
        last = c.traceback()[-1:] or [c.last or "(no output)"]
        origin = c.origin()
        why = f", because party {origin} failed" if origin not in (None, c.rank) else ""
        say(f"{c.label} failed too{why}: {c.exit_text()}: {last[0]}")
    if stopped:
        say(f"stopped {', '.join(stopped)}" + (f" ({interrupted})" if interrupted else ""))
    return code if code > 0 else 1


def _stop_all(children: list[_Child]) -> None:
    """SIGTERM every process group still running, SIGKILL after 5 s; reap them all."""
    for c in children:
        if c.proc.poll() is None:
            c.signalled = True
            try:
                os.killpg(c.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for c in children:
        try:
            c.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.signalled = True
            try:
                os.killpg(c.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            c.proc.wait()


def _party(args: argparse.Namespace) -> int:
    from .config import Config
    if args.protocol:  # the flag wins over the environment (the script's init() reads it)
        os.environ["CRYPTEN_LITE_PROTOCOL"] = args.protocol
    Config.from_env()  # fail early with a clear message on a bad environment
    sys.argv = [args.script, *args.args]
    runpy.run_path(args.script, run_name="__main__")
    return 0


def _dealer(args: argparse.Namespace) -> int:
    from .comm.dealer_rpc import DealerServer
    from .config import Config
    from .provider import dealer_handler

    config = Config.from_env()
    if config.protocol == "rss":
        print("crypten-lite dealer: CRYPTEN_LITE_PROTOCOL=rss needs no dealer (the 3 parties "
              "make their own randomness); start the dealer for protocol 'additive' only",
              file=sys.stderr)
        return 2
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


def version_text() -> str:
    """``crypten-lite X (torch Y, Python Z)``, from the installed packages' metadata (no import)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"
    return (f"crypten-lite {version('crypten_lite')} (torch {version('torch')}, "
            f"Python {sys.version.split()[0]})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crypten-lite", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print crypten_lite's, torch's and Python's versions and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("launch", help="run a script as N local parties (plus the dealer under "
                                      "the additive protocol)",
                       epilog="Session-wide settings set in this environment reach every party and "
                              "the dealer: CRYPTEN_LITE_TRUNCATION (local or exact), "
                              "CRYPTEN_LITE_PRECISION, CRYPTEN_LITE_MAX_MESSAGE_BYTES, "
                              "CRYPTEN_LITE_CONFIG, CRYPTEN_LITE_TLS_DIR (--tls-dir wins); launch "
                              "names them on stderr. Addresses, ranks and the session id are "
                              "launch's own.")
    p.add_argument("-n", type=int, default=2, help="number of parties (default 2)")
    p.add_argument("--protocol", choices=PROTOCOL_CHOICES, default=None,
                   help="sharing scheme: additive (N >= 2 parties, correlated randomness from "
                        "the dealer or --provider tfp) or rss (replicated secret sharing: "
                        "exactly 3 parties, honest majority, no dealer process); default "
                        "CRYPTEN_LITE_PROTOCOL, else additive; see docs/protocols.md")
    p.add_argument("--provider", choices=PROVIDER_CHOICES, default=None,
                   help="additive protocol's correlated randomness: dealer (secure, default), "
                        "pairwise (2 parties, no dealer process: homomorphic encryption between "
                        "the parties) or tfp (INSECURE); default CRYPTEN_LITE_PROVIDER, else "
                        "dealer; not with --protocol rss")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    p.add_argument("--tls-dir", default="", help="certificates from `crypten-lite certs`")
    p.add_argument("--progress", action="store_true",
                   help="rank 0 draws the pairwise provider's offline progress line (correlations, "
                        "MB/s, time left) even when stderr is not a terminal (CRYPTEN_LITE_PROGRESS=1)")
    p.add_argument("script", help="Python script calling crypten_lite.init()")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(fn=_launch)
    p = sub.add_parser("party", help="run one party of a session configured by CRYPTEN_LITE_*",
                       description="Run SCRIPT as one party of a session. The session comes from the "
                                   "environment (CRYPTEN_LITE_RANK, CRYPTEN_LITE_WORLD_SIZE, "
                                   "CRYPTEN_LITE_PARTIES, CRYPTEN_LITE_DEALER, CRYPTEN_LITE_TLS_DIR, "
                                   "CRYPTEN_LITE_PROTOCOL, ... or CRYPTEN_LITE_CONFIG); the script "
                                   "calls crypten_lite.init(). This is the container entrypoint; "
                                   "see docs/deployment.md.")
    p.add_argument("--protocol", choices=PROTOCOL_CHOICES, default=None,
                   help="sharing scheme, overriding CRYPTEN_LITE_PROTOCOL: additive (default; "
                        "needs CRYPTEN_LITE_DEALER with the dealer provider) or rss (exactly 3 "
                        "parties, no dealer); every party must use the same (checked at the "
                        "handshake); see docs/protocols.md")
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
    sub.add_parser("serve", help="private prediction service: parties as long-lived servers "
                                 "(see serve --help, docs/serving.md)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=os.environ.get("CRYPTEN_LITE_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if argv and argv[0] == "certs":
        return _certs(argv[1:])
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    if argv and argv[0] == "serve":
        from .serve.local import main as serve_main
        return serve_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
