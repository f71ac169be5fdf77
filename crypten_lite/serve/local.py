"""`crypten-lite serve`: the whole prediction service on one machine (like `launch`).

    crypten-lite serve --model lenet                  # 2 additive parties + dealer
    crypten-lite serve --model lenet --protocol rss   # 3 replicated parties, no dealer
    crypten-lite serve --model lenet --tls --web      # clients over TLS; the browser page

It starts the dealer (additive protocol with the dealer provider) and one server process per
party (crypten_lite.serve.server), prints the client endpoints and a client token, and writes
them to STATE_DIR/client.json (endpoints, token, CA file, page URL). When a party dies, the
others see the dead peer and stop; the supervisor then starts the whole session again, in
which every party reloads its own saved weight shares (crypten_lite.serve.store), on the
same client ports: clients retry meanwhile. SIGTERM / SIGINT stop every child; no process is
left behind (children run in their own process groups, killed on exit).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ..mpc.launcher import free_ports, local_env

PARTY_MODULE = "crypten_lite.serve.server"


class _Stop(Exception):
    pass


_stopping = False


def _raise_stop(*_):
    # One stop: a second signal must not cut the cleanup short. A flag, not SIG_IGN: CPython
    # refuses (OSError) a pending signal whose handler was switched to SIG_IGN meanwhile.
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise _Stop()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="crypten-lite serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="lenet", help="lenet, resnet18 or module:function")
    p.add_argument("--weights", default="", help="state dict of the model (party 0's)")
    p.add_argument("-n", type=int, default=None, help="parties (default 2; 3 under rss)")
    p.add_argument("--protocol", choices=("additive", "rss"), default="additive")
    p.add_argument("--provider", default="dealer",
                   help="additive protocol's correlated randomness (CRYPTEN_LITE_PROVIDER: "
                        "dealer, tfp (INSECURE), or another registered provider); passed through")
    p.add_argument("--host", default="127.0.0.1", help="interface of the client endpoints")
    p.add_argument("--ports", default="", help="client ports, comma-separated (default: free)")
    p.add_argument("--tls", action="store_true", help="TLS everywhere: parties, dealer, clients")
    p.add_argument("--tls-dir", default="", help="certificates (default: made in STATE_DIR)")
    p.add_argument("--client-ca", default="",
                   help="with --tls: CA of client certificates (clients then authenticate by "
                        "certificate, common name = client id)")
    p.add_argument("--tokens", default="", help="tokens file (default: one client 'local', "
                                                "its token printed)")
    p.add_argument("--state-dir", default="", help="weight shares, logs, client.json "
                                                   "(default: a temporary folder)")
    p.add_argument("--web", action="store_true", help="HTTP share endpoints + page on party 0")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-wait", type=float, default=0.25,
                   help="seconds the oldest request of a batch waits at most for it to fill")
    p.add_argument("--batch-gap", type=float, default=0.03,
                   help="a batch also closes after this many seconds without a new request")
    p.add_argument("--prefer", choices=("compute", "rounds"), default="compute",
                   help="compute: fewer comparisons and bytes, more rounds (one machine, a LAN); "
                        "rounds: the fewest rounds (a WAN)")
    p.add_argument("--compare-bits", type=int, default=64, choices=(32, 64),
                   help="32: max pools compare the low 32 bits only (faster; exact only while "
                        "pooled activations stay below 2^14); default 64 (exact)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds any MPC wait may take")
    p.add_argument("--max-restarts", type=int, default=5)
    return p


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM when the supervisor dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), so that no party or dealer outlives it."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _children_stop(children: list[subprocess.Popen], grace: float = 10.0) -> None:
    for c in children:
        if c.poll() is None:
            try:
                os.killpg(c.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace
    for c in children:
        try:
            c.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(c.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            c.wait()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    n = args.n or (3 if args.protocol == "rss" else 2)
    if args.prefer == "rounds" and args.compare_bits != 64:
        print("crypten-lite serve: --compare-bits applies to --prefer compute's pooling; drop it "
              "or use --prefer compute", file=sys.stderr)
        return 2
    if args.protocol == "rss" and n != 3:
        print("crypten-lite serve: --protocol rss runs exactly 3 parties", file=sys.stderr)
        return 2
    if args.provider == "tfp":
        print("crypten-lite serve: WARNING provider 'tfp' is insecure (party 0 plays dealer)",
              file=sys.stderr)
    temp = not args.state_dir
    state = pathlib.Path(args.state_dir or tempfile.mkdtemp(prefix="crypten-lite-serve-"))
    state.mkdir(parents=True, exist_ok=True)
    token = ""
    tokens = args.tokens
    if not tokens:
        token = secrets.token_urlsafe(32)
        tokens = str(state / "tokens.txt")
        from .server import token_digest
        pathlib.Path(tokens).write_text(f"local:{token_digest(token)}\n")
    tls_dir = ""
    if args.tls:
        tls_dir = os.path.abspath(args.tls_dir) if args.tls_dir else str(state / "certs")
        if not args.tls_dir:
            from ..certs import generate
            generate(tls_dir, n)
    ports = [int(p) for p in args.ports.split(",")] if args.ports else free_ports(n + 1)
    web_port = ports[n] if len(ports) > n else free_ports(1)[0]
    endpoints = [f"{args.host}:{p}" for p in ports[:n]]
    scheme = "https" if args.tls else "http"  # with --tls the page and share endpoints too
    web_urls = [f"{scheme}://{args.host}:{p}" for p in ([web_port] + free_ports(n - 1))] if args.web else []
    conn = {"endpoints": endpoints, "token": token, "protocol": args.protocol,
            "ca": str(pathlib.Path(tls_dir, "ca.pem")) if tls_dir else None,
            "identities": [f"party{r}" for r in range(n)], "web": web_urls[0] if web_urls else None,
            "web_endpoints": web_urls, "state_dir": str(state)}
    (state / "client.json").write_text(json.dumps(conn, indent=1))
    if web_urls:
        (state / "web.json").write_text(json.dumps({"endpoints": web_urls}))
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTEN_LITE_")}
    base.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // n)))
    previous = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    children: list[subprocess.Popen] = []
    code = 0
    try:
        for epoch in range(args.max_restarts + 1):
            for f in state.glob("ready-party*"):
                f.unlink()
            extra = {"CRYPTEN_LITE_TLS_DIR": tls_dir} if tls_dir else {}
            party_envs, dealer_env = local_env(n, args.provider, f"serve-{os.getpid()}-{epoch}",
                                               args.timeout, extra, args.protocol)
            children = []
            logs = lambda name: open(state / f"{name}.log", "a")  # noqa: E731
            popen = dict(stdin=subprocess.DEVNULL, start_new_session=True,
                         preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            if dealer_env is not None and args.provider == "dealer":
                children.append(subprocess.Popen([sys.executable, "-m", "crypten_lite.cli", "dealer"],
                                                 env={**base, **dealer_env}, stdout=logs("dealer"),
                                                 stderr=subprocess.STDOUT, **popen))
            for r, env in enumerate(party_envs):
                cmd = [sys.executable, "-m", PARTY_MODULE, "--model", args.model, "--listen",
                       endpoints[r], "--tokens", tokens, "--state-dir", str(state),
                       "--max-batch", str(args.max_batch), "--max-wait", str(args.max_wait),
                       "--batch-gap", str(args.batch_gap),
                       "--prefer", args.prefer, "--compare-bits", str(args.compare_bits)]
                cmd += ["--weights", args.weights] if args.weights else []
                cmd += ["--tls"] if args.tls else []
                cmd += ["--client-ca", os.path.abspath(args.client_ca)] if args.client_ca else []
                if web_urls:
                    cmd += ["--web", web_urls[r].split("://", 1)[1], "--web-origin", web_urls[0]]
                    cmd += ["--web-page", "--web-config", str(state / "web.json")] if r == 0 else []
                children.append(subprocess.Popen(cmd, env={**base, **env}, stdout=logs(f"party{r}"),
                                                 stderr=subprocess.STDOUT, **popen))
            (state / "pids.json").write_text(json.dumps(
                {"parties": [c.pid for c in children[-n:]], "all": [c.pid for c in children],
                 "epoch": epoch}))
            parties = children[-n:]
            announced = False
            while all(c.poll() is None for c in parties):
                if not announced and all((state / f"ready-party{r}").exists() for r in range(n)):
                    announced = True
                    print(f"crypten-lite serve: ready (epoch {epoch}); client endpoints: "
                          f"{','.join(endpoints)}" + (f"; page {web_urls[0]}/#token={token}" if web_urls else "")
                          + (f"; token {token}" if token and epoch == 0 else "")
                          + f"; connection file {state / 'client.json'}", flush=True)
                time.sleep(0.1)
            dead = [r for r, c in enumerate(parties) if c.poll() is not None]
            print(f"crypten-lite serve: parties {dead} exited (codes "
                  f"{[parties[r].returncode for r in dead]}); restarting the session from the "
                  "saved shares", file=sys.stderr, flush=True)
            _children_stop(children)
        print("crypten-lite serve: too many restarts; giving up", file=sys.stderr)
        code = 1
    except _Stop:
        code = 0
    finally:
        global _stopping
        _stopping = True  # nor may a signal during the cleanup after a restart loop ends
        _children_stop(children)
        for s, h in previous.items():
            signal.signal(s, h)
        if temp:
            shutil.rmtree(state, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
