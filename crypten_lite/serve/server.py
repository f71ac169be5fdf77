"""One computing party of the prediction service: the model loaded once, requests batched.

    python -m crypten_lite.serve.server --model lenet --listen 0.0.0.0:9100 \
        --tokens tokens.txt --state-dir /var/lib/crypten-lite    # session from CRYPTEN_LITE_*

The party joins the MPC session of its peers (crypten_lite.init(): the same parties, dealer
or rss, TLS and handshakes as any script), converts the model (party 0 owns it; its
description travels in-band, nn.from_pytorch) and shares its weights once, or reloads its own
saved shares when every party holds shares of the same model (crypten_lite.serve.store).
A warm-up prediction makes the fixed-weight masks before the party reports ready (so the plan
recorded on the first batch of each size holds for every later one: metrics `planned_batches`).

Threads: the client-facing gRPC service (comm.serve_rpc) and the optional HTTP endpoint
(serve.web) validate each request and park it; the main thread runs the parties' lockstep
loop: announce what arrived, receive the leader's decision (serve.batching), fail the
requests it names, run the batch. Outputs are re-randomised with a fresh zero sharing from
the session's pairwise PRGs and go back only to the call that brought the request.
A dead peer ends the session: every parked request fails with "unavailable" (clients retry)
and the process exits with EXIT_SESSION_LOST so that its supervisor restarts the service.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import logging
import os
import pathlib
import re
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import torch

from .. import session as session_mod
from ..comm import serve_rpc
from ..cryptensor import CrypTensor, no_grad
from ..errors import ConfigError, CryptenLiteError
from ..functions.pooling import fewer_comparisons
from ..mpc import offline, rss
from ..mpc.replicated import Replicated
from ..random import zero_share
from . import batching, store
from .errors import ServeError
from .metrics import Metrics
from .wire import Shares, to_bytes, validate

log = logging.getLogger("crypten_lite.serve")
EXIT_SESSION_LOST = 75
CLIENT_ID = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
GRACE = 5.0  # seconds a caller waits past its deadline for the leader's verdict
MAX_PLANS = 128  # correlation plans kept (one per batch size seen; least recently used dropped)


def load_tokens(path: str) -> dict[str, str]:
    """{sha256(token) hex: client id} from lines `client-id:sha256-hex` (# comments)."""
    out = {}
    for n, line in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        client, _, digest = line.partition(":")
        if not CLIENT_ID.fullmatch(client) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ServeError("invalid", f"{path}:{n}: expected 'client-id:sha256-hex-of-token'")
        out[digest] = client
    return out


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def build_model(spec: str, weights: str = ""):
    """(torch model, sample shape) of `spec`: lenet, resnet18, or module:function."""
    from .. import models
    if spec == "lenet":
        torch.manual_seed(0)  # insecure-ok: public demo weights, not a secret of the protocol
        model, shape = models.lenet(), (1, 28, 28)
    elif spec == "resnet18":
        model, shape = models.build_model(width=64, seed=0), (3, 32, 32)
    elif ":" in spec:
        import importlib
        mod, _, fn = spec.partition(":")
        model, shape = getattr(importlib.import_module(mod), fn)()
    else:
        raise ServeError("invalid", f"--model {spec!r}: use lenet, resnet18 or module:function "
                                    "(returning (model, sample_shape))")
    if weights:
        model.load_state_dict(torch.load(weights, weights_only=True))
    return model.eval(), tuple(shape)


@dataclass
class _Req:
    shares: Shares
    t0: float
    event: threading.Event = field(default_factory=threading.Event)
    reply: object = None
    error: tuple[str, str] | None = None


class Party:
    """The service of one party (the handler comm.serve_rpc calls) and its lockstep loop."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.metrics = Metrics()
        self.pb = serve_rpc.messages()
        self.ready = False
        self.stop = False
        self._lock = threading.Lock()
        self._pending: dict[str, _Req] = {}
        self._closed = False  # set (under the lock) once the session ended: nothing is parked
        self._running: list[_Req] = []  # the batch being computed (failed too if the session ends)
        self._new: list = []
        self._arrived = threading.Event()  # set by a handler that parks a request
        self._cancel: list[str] = []
        self._tokens: dict[str, str] = {}
        self._tokens_mtime = None
        self._tokens_checked = time.monotonic()
        self._tokens_lock = threading.Lock()
        self._reload_tokens()
        self.rank = int(os.environ.get("CRYPTEN_LITE_RANK", "0"))
        self.world_size = int(os.environ.get("CRYPTEN_LITE_WORLD_SIZE", "0") or 0)
        self.protocol = os.environ.get("CRYPTEN_LITE_PROTOCOL", "additive")
        self.sample_shape: tuple[int, ...] = ()
        self.precision = 16
        self.model_name = args.model
        self._plans: collections.OrderedDict[int, list] = collections.OrderedDict()
        self._ahead: int | None = None  # the batch size whose corrections are prefetched

    # -- the handler (gRPC and HTTP threads) -------------------------------------------
    def _reload_tokens(self) -> None:
        try:
            mtime = os.stat(self.args.tokens).st_mtime_ns
            if mtime != self._tokens_mtime:
                self._tokens, self._tokens_mtime = load_tokens(self.args.tokens), mtime
        except (OSError, ServeError) as e:
            log.error("party %d: cannot read the tokens file: %s", self.rank, e)

    def authenticate(self, token: str, certificate_name: str | None = None) -> str | None:
        """The client id of `token`, or None. The tokens file is re-read when it changes
        (checked at most once a second): rotation needs no restart.
        With client certificates (--client-ca), `certificate_name` is the common name of the
        certificate the handshake verified: it is the client id (a token is then optional;
        one sent anyway must name the same client)."""
        with self._tokens_lock:
            now = time.monotonic()
            if now - self._tokens_checked > 1.0:
                self._tokens_checked = now
                self._reload_tokens()
            tokens = self._tokens
        by_token = tokens.get(token_digest(token)) if token else None
        if certificate_name is None:
            return by_token
        if not CLIENT_ID.fullmatch(certificate_name) or (token and by_token != certificate_name):
            return None
        return certificate_name

    def info(self):
        return self.pb.InfoReply(party=self.rank, world_size=self.world_size, protocol=self.protocol,
                                 sample_shape=list(self.sample_shape), precision=self.precision,
                                 model=self.model_name, ready=self.ready,
                                 max_batch=self.args.max_batch, metrics_json=self.metrics.json())

    def predict(self, client: str, msg, cancelled):
        self.metrics.request()
        try:
            return self._predict(client, msg, cancelled)
        except ServeError as e:
            self.metrics.error(e.kind)
            raise

    def _predict(self, client: str, msg, cancelled):
        t0 = time.monotonic()
        if not self.ready or self.stop:
            raise ServeError("unavailable", f"party {self.rank} is not ready (starting or "
                                            "stopping): retry shortly")
        n_comp = 2 if self.protocol == "rss" else 1
        shares = validate(msg, self.sample_shape, self.precision, n_comp, self.args.max_batch,
                          self.args.default_timeout, self.args.max_timeout)
        key = f"{client}/{shares.request_id.hex()}"
        req = _Req(shares, t0)
        with self._lock:
            if self._closed:
                raise ServeError("unavailable", f"party {self.rank}: the serving session ended; "
                                                "retry: the service restarts")
            if len(self._pending) >= self.args.max_pending:
                raise ServeError("busy", f"party {self.rank} holds {len(self._pending)} requests "
                                         "(its limit): retry later")
            if key in self._pending:
                raise ServeError("duplicate", "this request id is already pending: use a fresh "
                                              "random request id per prediction")
            self._pending[key] = req
            self._new.append([key, list(shares.shape), shares.timeout_s])
        self._arrived.set()
        deadline = t0 + shares.timeout_s + GRACE
        while not req.event.wait(0.25):  # the answer, or a look at cancel and deadline
            if cancelled() or time.monotonic() > deadline:
                with self._lock:
                    if key in self._pending:
                        self._cancel.append(key)
                if cancelled():
                    raise ServeError("cancelled", "the client cancelled the request")
                raise ServeError("deadline", f"no answer within the request's {shares.timeout_s:.1f} s")
        if req.error is not None:
            raise ServeError(*req.error)
        self.metrics.done(time.monotonic() - t0)
        return req.reply

    # -- the lockstep loop (main thread) --------------------------------------------------
    def _finish(self, key: str, kind: str, message: str) -> None:
        with self._lock:
            req = self._pending.pop(key, None)
        if req is not None:
            req.error = (kind, message)
            req.event.set()

    def _fail_all(self, kind: str, message: str) -> None:
        with self._lock:
            self._closed = True
            keys = list(self._pending)
        for key in keys:
            self._finish(key, kind, message)
        for req in self._running:
            if not req.event.is_set():
                req.error = (kind, message)
                req.event.set()

    def _load_model(self, session):
        from ..nn import from_pytorch
        comm = session.comm
        model, shape = build_model(self.args.model, self.args.weights) if self.rank == 0 else (None, None)
        shape_msg = comm.broadcast(batching.pack({"shape": list(shape)}) if self.rank == 0 else None, 0)
        self.sample_shape = tuple(batching.unpack(shape_msg)["shape"])
        private = from_pytorch(model, (1, *self.sample_shape), src=0)
        names = [(n, list(t.shape)) for n, t in private.state_dict().items()]
        digest = hashlib.sha256(repr((self.args.model, self.sample_shape, names)).encode()).hexdigest()
        self.model_name = f"{self.args.model}@{digest[:12]}"
        path = store.path_for(self.args.state_dir, self.rank)
        saved, mine = None, ""
        try:
            saved = store.read_meta(path)
        except CryptenLiteError as e:
            log.warning("party %d: saved shares refused (%s); sharing afresh", self.rank, e)
        if saved is not None:
            h = saved[0]
            if (h.get("digest"), h.get("rank"), h.get("protocol"), h.get("world_size")) == (
                    digest, self.rank, self.protocol, self.world_size):
                mine = str(h.get("model_id", ""))
        said = [batching.unpack(t) for t in comm.all_gather(batching.pack(
            {"id": mine, "prefer": [self.args.prefer, self.args.compare_bits]}))]
        prefer = [tuple(s.get("prefer") or ()) for s in said]
        if len(set(prefer)) > 1:
            raise ConfigError(f"party {self.rank}: the parties run with different --prefer / "
                              f"--compare-bits ({prefer}, by rank): start every party with the same")
        ids = {s.get("id") for s in said}
        if mine and ids == {mine}:
            store.load(private, saved[0], saved[1], self.rank)
            self.reloaded = True
        else:
            private.encrypt(src=0)
            new_id = comm.broadcast(batching.pack({"id": secrets.token_hex(16)}) if self.rank == 0 else None, 0)
            store.save(private, path, {"digest": digest, "model_id": batching.unpack(new_id)["id"],
                                       "rank": self.rank, "protocol": self.protocol,
                                       "world_size": self.world_size})
            self.reloaded = False
        return private.eval()

    def _share_of(self, comps: list[torch.Tensor]):
        return Replicated(comps[0], comps[1], self.rank) if len(comps) == 2 else comps[0]

    def _pooling(self):
        """The pooling preference of every private forward (functions.pooling)."""
        return fewer_comparisons(self.args.prefer == "compute", self.args.compare_bits)

    def _forward(self, private, x: CrypTensor) -> CrypTensor:
        """The private forward of one batch. The first batch of each size records its plan
        (the public list of correlation requests, mpc.offline); every later batch of that
        size asks the dealer for all its corrections in one Prepare before it runs (instead
        of a dealer round trip per request). Every party takes the same branch: batch sizes
        are the leader's public decision."""
        n = int(x.shape[0])
        plan = self._plans.get(n)
        ahead, self._ahead = self._ahead, None
        with no_grad(), self._pooling():
            if plan is not None:
                self._plans.move_to_end(n)
                if ahead != n:  # else: prefetched after the previous batch (_prefetch_next)
                    offline.prefetch(plan, wait=False)
                provider = getattr(session_mod.current(), "provider", None)
                diverged = provider.stats["diverged"] if provider is not None else 0
                y = private(x)
                if provider is None or provider.stats["diverged"] == diverged:
                    self.metrics.planned()  # the plan held to its end
                return y
            with offline.record() as plan:
                y = private(x)
        self._plans[n] = plan
        while len(self._plans) > MAX_PLANS:
            self._plans.popitem(last=False)
        return y

    def _prefetch_next(self, n: int) -> None:
        """After a batch of `n` (padded) samples has answered: ask the dealer now for the
        corrections of a next batch of the same size, so that it prepares them while the next
        batch forms instead of while the parties wait at its start. A next batch of another
        size leaves the plan at its first request and fetches as usual (mpc.offline: the
        prefetched counters are skipped, never reused). Every party calls it at the same point
        (a collective). Not under rss: there the parties make the pairs themselves, on the
        critical path either way."""
        plan = self._plans.get(n)
        if plan is None or self.protocol == "rss":
            return
        offline.prefetch(plan, wait=False)
        self._ahead = n

    def _run_batch(self, private, keys: list[str], tag: str) -> None:
        with self._lock:
            reqs = [self._pending.pop(k, None) for k in keys]
        if any(r is None for r in reqs):
            raise CryptenLiteError(f"party {self.rank}: the leader batched a request this party "
                                   "does not hold")
        self._running = reqs
        n_comp = len(reqs[0].shares.components)
        n = sum(r.shares.shape[0] for r in reqs)
        # Padded to a public bucket size with shares of 0 (rows computed and dropped): a few
        # batch sizes, so that every batch runs a recorded plan with its corrections prefetched.
        pad = batching.bucket(n, self.args.max_batch) - n
        comps = [torch.cat([r.shares.components[i] for r in reqs]
                           + ([reqs[0].shares.components[i].new_zeros((pad, *self.sample_shape))]
                              if pad else [])) for i in range(n_comp)]
        x = CrypTensor(self._share_of(comps), self.precision, torch.float32)
        y = self._forward(private, x)
        out = y.share
        if getattr(out, "is_replicated_share", False):
            mine = out.a + rss.zero_share(tuple(out.shape))   # 3-out-of-3 zero sharing
        else:
            mine = out + zero_share(session_mod.current().pair_prgs, self.rank, tuple(out.shape))
        self.metrics.batch(n)
        start = 0
        for i, r in enumerate(reqs):
            n = r.shares.shape[0]
            part = mine[start:start + n]
            start += n
            r.reply = self.pb.PredictReply(request_id=r.shares.request_id, shape=list(part.shape),
                                           precision=y.precision, share=to_bytes(part),
                                           computation=f"{tag}:{i}", party=self.rank)
            r.event.set()
        self._running = []
        self._prefetch_next(int(comps[0].shape[0]))

    def _tick(self, comm, scheduler, batch_no: int) -> dict:
        with self._lock:
            ann = {"new": self._new, "cancel": self._cancel, "stop": self.stop}
            self._new, self._cancel = [], []
            self._arrived.clear()
        if self.rank != 0:
            comm.gather(batching.pack(ann), 0)
            return batching.unpack(comm.broadcast(None, 0))
        stop = False
        for p, t in enumerate(comm.gather(batching.pack(ann), 0)):
            a = ann if p == 0 else batching.unpack(t)
            scheduler.announce(p, a.get("new", []), a.get("cancel", []))
            stop = stop or bool(a.get("stop"))
        batch, fails = scheduler.decide()
        decision = {"batch": batch, "fail": fails, "stop": stop,
                    "tag": f"{self.session_id}/{batch_no}", "idle": not scheduler.entries}
        comm.broadcast(batching.pack(decision), 0)
        return decision

    def run(self) -> int:
        import crypten_lite
        from .web import WebServer
        crypten_lite.init()
        session = session_mod.current()
        self.rank, self.world_size = session.rank, session.world_size
        self.protocol, self.precision = session.config.protocol, session.config.precision
        self.session_id = hashlib.sha256(session.config.session.encode()).hexdigest()[:8]
        private = self._load_model(session)
        with no_grad(), self._pooling():
            # warm-up: the fixed-weight masks are made here, once
            z = torch.zeros((1, *self.sample_shape), dtype=torch.int64)
            private(CrypTensor(self._share_of([z, z] if self.protocol == "rss" else [z]),
                               self.precision, torch.float32))
        tls = None
        if self.args.tls:
            from ..comm.tls import load, party_identity
            tls = load(session.config.tls_dir, party_identity(self.rank))
        client_ca = None
        if self.args.client_ca:
            if tls is None:
                raise ConfigError(f"party {self.rank}: --client-ca needs --tls")
            client_ca = pathlib.Path(self.args.client_ca).read_bytes()
        rpc = serve_rpc.ServeServer(self.args.listen, self, tls, client_ca=client_ca)
        web = WebServer(self.args.web, self, self.args, tls) if self.args.web else None
        self.ready = True
        if self.args.state_dir:
            pathlib.Path(self.args.state_dir, f"ready-party{self.rank}").write_text(
                f"{os.getpid()} {session.config.session} reloaded={int(self.reloaded)}\n")
        print(f"party {self.rank}: serving {self.model_name} on {self.args.listen} "
              f"({'reloaded saved shares' if self.reloaded else 'weights shared'})", flush=True)
        scheduler = batching.Scheduler(self.world_size, self.args.max_batch, self.args.max_wait,
                                       self.args.batch_gap or None)
        code, batch_no = 0, 0
        try:
            while True:
                decision = self._tick(session.comm, scheduler, batch_no)
                for key, kind, message in decision["fail"]:
                    self._finish(key, kind, message)
                if decision["batch"]:
                    self._run_batch(private, decision["batch"], decision["tag"])
                    batch_no += 1
                elif decision["stop"]:
                    break
                elif decision.get("idle"):  # nothing pending anywhere: tick when a request
                    # arrives here (clients send to every party at once) or after idle_tick
                    self._arrived.wait(self.args.idle_tick)
                else:
                    time.sleep(self.args.tick)
        except Exception as e:  # noqa: BLE001 (the session is lost: every caller is told)
            log.error("party %d: session lost: %s", self.rank, e)
            print(f"party {self.rank}: session lost ({type(e).__name__}: {e})", file=sys.stderr,
                  flush=True)
            code = EXIT_SESSION_LOST
        self.ready = False
        self._fail_all("unavailable", f"party {self.rank}: the serving session ended (a party "
                                      "stopped or failed); retry: the service restarts")
        rpc.stop(1.0)
        if web is not None:
            web.stop()
        crypten_lite.uninit()
        return code


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m crypten_lite.serve.server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="lenet", help="lenet, resnet18 or module:function returning "
                                                    "(torch model, sample shape); party 0 only")
    p.add_argument("--weights", default="", help="state dict file (torch.load weights_only)")
    p.add_argument("--listen", required=True, help="client endpoint host:port")
    p.add_argument("--tokens", required=True, help="file of 'client-id:sha256-hex' lines")
    p.add_argument("--state-dir", required=True, help="where this party keeps its weight shares")
    p.add_argument("--client-ca", default="",
                   help="with --tls: CA certificate (PEM) of client certificates; every gRPC "
                        "client must then present one it signed, whose common name is its "
                        "client id (tokens become optional there; the --web endpoint keeps tokens)")
    p.add_argument("--tls", action="store_true",
                   help="serve clients over TLS with this party's certificate (CRYPTEN_LITE_TLS_DIR)")
    p.add_argument("--max-batch", type=int, default=64, help="samples per MPC batch (and request)")
    p.add_argument("--max-wait", type=float, default=0.25,
                   help="seconds the oldest request of a batch waits at most for it to fill")
    p.add_argument("--batch-gap", type=float, default=0.03,
                   help="a batch also closes once no new request arrived for this many seconds "
                        "(0: only --max-wait and --max-batch close it)")
    p.add_argument("--tick", type=float, default=0.005,
                   help="seconds between ticks while requests wait for their batch")
    p.add_argument("--idle-tick", type=float, default=0.02,
                   help="seconds between ticks while no request is pending at any party")
    p.add_argument("--max-pending", type=int, default=1024, help="requests parked at once")
    p.add_argument("--prefer", choices=("compute", "rounds"), default="compute",
                   help="compute (default): max pooling by a values-only tree (fewer comparisons "
                        "and bytes, more rounds: for a LAN or one machine); rounds: the fewest "
                        "rounds (all-pairs comparisons: for a WAN). Every party must use the same")
    p.add_argument("--compare-bits", type=int, default=64, choices=(32, 64),
                   help="with --prefer compute: 32 compares pooled activations on their low 32 "
                        "bits (a shorter circuit), exact only while every activation entering a "
                        "max pool is below 2^14 in magnitude at 16 fractional bits; default 64 "
                        "(exact over the whole fixed-point range)")
    p.add_argument("--default-timeout", type=float, default=30.0)
    p.add_argument("--max-timeout", type=float, default=300.0)
    p.add_argument("--web", default="", help="host:port of the HTTP share endpoint (browsers)")
    p.add_argument("--web-page", action="store_true", help="also serve the static page there")
    p.add_argument("--web-origin", default="", help="origin allowed by CORS (the page's)")
    p.add_argument("--web-config", default="", help="JSON file the page reads (endpoints)")
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("CRYPTEN_LITE_LOG", "WARNING"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = parser()
    args = p.parse_args(argv)
    if args.prefer == "rounds" and args.compare_bits != 64:
        p.error("--compare-bits applies to --prefer compute's pooling; --prefer rounds compares "
                "on 64 bits: drop --compare-bits or use --prefer compute")
    party = Party(args)

    def stop(*_):
        if not party.ready:
            raise SystemExit(0)
        party.stop = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return party.run()


if __name__ == "__main__":
    sys.exit(main())
