"""`make serve`: a registered model behind rul's guard, run by uvicorn.

    python -m rul.serving.server MODEL [--host H] [--port P] [--docs] [--memory-mb MB]
        [--max-body-mb MB] [--timeout S] [--header-timeout S] [--min-rate-kb KB]
        [--keep-alive S] [--max-connections N]

MODEL is a model URI (`models:/rul-fd001@champion`, `runs:/<id>/model`) or a model folder. The
routes and request formats are MLflow's scoring server's; rul's guard (rul.serving.guard)
answers `/invocations` itself, in strict JSON, within the limits of rul.serving.limits (each a
flag and an environment variable), large bodies in a worker process (rul.serving.lanes). It
needs only what the model's own requirements install: in a lean environment, run it from the
model folder's code/ (docs: Predict and serve).
"""

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import tempfile
from dataclasses import replace
from types import SimpleNamespace

from rul.interrupts import interrupts_as_exceptions
from rul.serving import refusal_log, served
from rul.serving.connections import protocol
from rul.serving.guard import Guard
from rul.serving.lanes import Lanes
from rul.serving.limits import Limits, add_flags, from_args
from rul.serving.listening import CannotListen, bound_sockets
from rul.urls import masked

TIMEOUT_ENV = "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT"
SPARE_FILES = 256  # file descriptors kept besides the connections (the store, the worker)


def build(model_uri: str, limits: Limits, folder: str, docs: bool = False) -> Guard:
    """The guarded ASGI app serving `model_uri` (downloaded into `folder`) read as data
    (rul.serving.served: never its code), its worker process started and its model loaded;
    ValueError in one line when it is not a rul model rul can read."""
    os.environ[TIMEOUT_ENV] = str(int(limits.timeout))  # read by MLflow's init
    from mlflow.models import Model
    from mlflow.pyfunc import scoring_server

    path = served.local_model(model_uri, folder)
    model = served.Served(served.load(path, model_uri))  # refused before a worker starts
    lanes = Lanes(path, scratch=(folder,))
    lanes.model = model
    lanes.wait_ready()
    # MLflow's app answers /ping, /health, /version (and /docs): none of them reads the model
    return Guard(scoring_server.init(SimpleNamespace(metadata=Model())), lanes, limits, docs)


def open_files(limits: Limits) -> Limits:
    """Raise the soft limit on open files to fit the connection cap where the hard limit
    allows; else lower the cap to fit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = limits.max_connections + SPARE_FILES
    if soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft < wanted:
        return replace(limits, max_connections=max(16, soft - SPARE_FILES))
    return limits


def describe(limits: Limits) -> str:
    return (f"bodies up to {limits.max_body / 2**20:.1f} MB, a memory budget of "
            f"{limits.memory_mb:g} MB, {limits.timeout:g} s per request, headers within "
            f"{limits.header_timeout:g} s, bodies at {limits.min_rate_kb:g} KB/s or faster, "
            f"idle connections closed after {limits.keep_alive:g} s, at most "
            f"{limits.max_connections} connections")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rul.serving.server",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="models:/rul-fd001@champion, runs:/<id>/model or a folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--docs", action="store_true",
                        help="serve FastAPI's /docs, /redoc and /openapi.json (off by default)")
    add_flags(parser)
    args = parser.parse_args(argv)
    limits = open_files(from_args(parser, args))
    refusal_log.install()
    # Ctrl-C and SIGTERM (a service manager stopping it) as exceptions, also once uvicorn has
    # shut down and raised the signal again: the normal end, exit 0, the scratch folders removed
    try:
        with interrupts_as_exceptions(), \
                tempfile.TemporaryDirectory(prefix="rul-serve-") as folder:
            _run(args, limits, folder)
    except KeyboardInterrupt:  # Terminated (SIGTERM) included
        print("stopped", file=sys.stderr)
    except ValueError as error:  # a folder that is not a rul model: one line
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def _run(args, limits: Limits, folder: str) -> None:
    import uvicorn

    try:  # before the model loads: a taken port is said at once
        sockets = bound_sockets(args.host, args.port)
    except CannotListen as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    try:
        guard = build(args.model, limits, folder, args.docs)
        served = uvicorn.Config(guard, host=args.host, port=args.port, http=protocol(limits),
                                timeout_keep_alive=limits.keep_alive, log_config=None,
                                log_level="warning")
        said = (f"serving {masked(args.model)} on http://{args.host}:{args.port}/invocations "
                f"({describe(limits)})")
        try:
            asyncio.run(_serve(uvicorn.Server(served), sockets, said))
        finally:
            guard.lanes.close()
    finally:
        for sock in sockets:
            sock.close()


async def _serve(server, sockets, said: str) -> None:
    """Serve on the bound `sockets`; `said` is printed once the server listens on them."""
    asyncio.get_running_loop().set_exception_handler(refusal_log.loop_exception_handler)
    serving = asyncio.ensure_future(server.serve(sockets=sockets))
    while not server.started and not serving.done():
        await asyncio.wait({serving}, timeout=0.05)
    if server.started:
        print(said, file=sys.stderr, flush=True)
    await serving


if __name__ == "__main__":
    main()
