"""`rlgen serve`: the plan's engines as Ray actors, behind the HTTP API of ``rlgen.serve.app``, until Ctrl-C.

The run directory (Hydra's) gets run.log and serve.json (the address, the process id and the engines), so
scripts can find a server they started. A problem found before start (a bad value, a port in use, a
non-loopback bind without a token) is one sentence and exit 2; engines that cannot start, one sentence and
exit 1."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

from rlgen.commands.checks import planned, print_problems
from rlgen.commands.train import run_dir
from rlgen.config import RunConfig, Transport, to_run_config
from rlgen.models import load_tokenizer, prepare_model
from rlgen.plan import PlanError
from rlgen.plan.placement import plan_bundles
from rlgen.plan.serve import build_serve_plan, served_adapters
from rlgen.runlog import LOG_FILE, MirroredConsole, attach_run_log
from rlgen.runtime.cluster.actors import QUIET_ENV, ActorFactory, connect, engine_class, release
from rlgen.runtime.cluster.waits import Waiter
from rlgen.runtime.errors import RunError, StopRequested
from rlgen.runtime.signals import StopFlag
from rlgen.runtime.start.on_thread import Beside
from rlgen.serve.checks import serve_token
from rlgen.serve.pool import EnginePool, ServedModel

log = logging.getLogger(__name__)


def _served_model(cfg: RunConfig, plan: Any, model_path: str, health: dict[str, Any]) -> Any:
    """The served model, from the plan and what engine 0 says of itself (its dtype, its logprobs limit)."""

    adapters, max_lora_rank = served_adapters(cfg, plan.engine)
    return ServedModel(name=cfg.model.name if not cfg.model.path else str(cfg.model.path), path=model_path,
                       params=plan.model.params, vocab_size=plan.model.vocab_size,
                       max_model_len=int(cfg.engine.max_model_len), engine_kind=plan.engine_kind,
                       tensor_parallel_size=cfg.engine.tensor_parallel_size, tokenizer=load_tokenizer(model_path),
                       nccl_weights=plan.transport is Transport.nccl and plan.engine.receives_nccl,
                       pauses=plan.engine.in_flight_updates,
                       nccl_env=plan.nccl_env,
                       adapters=adapters, max_lora_rank=max_lora_rank, config=cfg.model,
                       dtype=health.get("dtype") or str(cfg.engine.dtype), max_logprobs=health.get("max_logprobs"))


def serve(plan: Any, out_dir: Path, console: Any) -> None:
    """Start the plan's engines, serve until a signal, and take everything down."""
    import uvicorn

    from rlgen.serve.app import make_app
    from rlgen.serve.server import server_config

    cfg = plan.config
    token = serve_token(cfg)
    for var, val in QUIET_ENV.items():
        os.environ.setdefault(var, val)
    stop = StopFlag()
    stop.install()
    waiter = Waiter(cfg.timeout_s, stop, out_dir)
    started, pgs, engines = False, [], []
    try:
        model = Beside(prepare_model, cfg, "cuda" if plan.device == "cuda" else "cpu")  # while Ray starts
        placement = plan_bundles(plan)
        started, node_ids, pgs = connect(cfg, plan, placement, stop, waiter)
        model_path = model.result(stop)
        engine_cls, engine_kwargs = engine_class(plan)
        if plan.engine_kind == "vllm":  # a server's requests may sample with anything: vLLM's whole warm-up
            engine_kwargs = {**engine_kwargs, "sampler_warmup": "all"}
        factory = ActorFactory(cfg, plan, placement, pgs, node_ids, engine_cls, engine_kwargs, type(None), {})
        console.print(f"starting {len(plan.engines)} {plan.engine_kind} engine(s) of TP "
                      f"{cfg.engine.tensor_parallel_size} for {cfg.model.name}", highlight=False)
        engines = [factory.engine(i, model_path, 0) for i in range(len(plan.engines))]
        health = waiter.get([e.health.remote() for e in engines], "engine start-up", cfg.startup_timeout_s)
        model = _served_model(cfg, plan, model_path, health[0])
        pool = EnginePool(engines, model, timeout_s=cfg.serve.request_timeout_s)
        app = make_app(pool, token=token, max_sequences=cfg.serve.max_sequences, max_body_mb=cfg.serve.max_body_mb,
                       max_queue=cfg.serve.max_queue, body_timeout_s=cfg.serve.body_timeout_s)
        stop.uninstall()  # uvicorn takes SIGINT and SIGTERM for a graceful shutdown
        url = f"http://{cfg.serve.host}:{cfg.serve.port}"
        (out_dir / "serve.json").write_text(json.dumps({
            "url": url, "pid": os.getpid(), "model": pool.model.name, "engine_kind": plan.engine_kind,
            "data_parallel": len(engines), "tensor_parallel_size": cfg.engine.tensor_parallel_size,
            "max_model_len": pool.model.max_model_len, "token_required": bool(token), "started": time.time()},
            indent=2) + "\n")
        lora = ", /v1/load_lora_adapter" if pool.model.adapters else ""
        console.print(f"serving {escape(pool.model.name)} on {url}: {len(engines)} engine(s), /generate, "
                      f"/v1/completions, /weights{lora}; Ctrl-C stops", highlight=False)
        server = uvicorn.Server(server_config(app, cfg.serve.host, cfg.serve.port, cfg.serve.header_timeout_s,
                                              timeout_graceful_shutdown=5))
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the handlers that
        # were there before it: these, which end the run so the engines and Ray are taken down below.
        previous = {sig: signal.signal(sig, _signalled) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.run()
        except _Signalled as sig:
            console.print(f"server stopped ({sig})", highlight=False)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        stop.uninstall()
        release(engines, pgs, started)


def _plan(cfg: RunConfig) -> Any:
    """The plan the command line built, or (called without it) built here."""

    return planned(cfg) or build_serve_plan(cfg, serve_token(cfg))


class _Signalled(Exception):
    pass


def _signalled(signum: int, frame: Any) -> None:
    raise _Signalled(signal.Signals(signum).name)


def serve_app(dict_cfg: Any) -> None:
    """Hydra entry point of `rlgen serve`."""

    console = MirroredConsole()
    out = run_dir()
    out.mkdir(parents=True, exist_ok=True)
    detach = attach_run_log(out)
    try:
        serve(_plan(to_run_config(dict_cfg)), out, console)
    except PlanError as err:
        sys.exit(print_problems(err.problems))
    except StopRequested:
        console.print("stopped during start-up", highlight=False)
        sys.exit(130)
    except RunError as err:
        print_problems([f"{err} (details: {out / LOG_FILE})"])
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 - one line here, the traceback in run.log
        log.info("the server failed", exc_info=err)
        print_problems([f"unexpected {type(err).__name__}: {err} (details: {out / LOG_FILE})"])
        sys.exit(1)
    finally:
        detach()
