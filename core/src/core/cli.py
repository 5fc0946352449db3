"""The ``core`` command: ``core devices``, ``core serve``, ``core bench``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from plugins import EnvConfigError, PluginError

from core import __version__
from core.bench.cli import add_bench_parser
from core.config import add_engine_args, config_from_args
from core.discovery import PluginRecord, discover
from core.server.chat_templates import TemplateBudget

logger = logging.getLogger("core")


def _device_rows(records: list[PluginRecord]) -> list[dict]:
    rows = []
    for r in records:
        info: dict = {}
        if r.is_available:
            try:
                info = r.platform.device_info()
            except Exception as exc:  # device_info is informational: report, don't fail the listing
                info = {"error": f"device_info() raised {type(exc).__name__}: {exc}"}
        rows.append(
            {
                "name": r.name,
                "distribution": r.dist_name,
                "version": r.version,
                "device_type": r.platform.device_type if r.platform else None,
                "priority": r.platform.priority if r.platform else None,
                "available": r.is_available,
                "reason": r.reason,
                "device_info": info,
            }
        )
    return rows


def _env_rows(records: list[PluginRecord]) -> list[dict]:
    rows = []
    for r in records:
        for var in r.platform.env_vars if r.platform else ():
            raw = var.raw(os.environ)
            try:
                var.read(os.environ)
                error = None
            except EnvConfigError as exc:
                error = str(exc)
            rows.append(
                {
                    "plugin": r.name,
                    "variable": var.env_name,
                    "value": raw[1] if raw else None,
                    "set_as": raw[0] if raw else None,
                    "default": var.default,
                    "help": var.help,
                    "error": error,
                }
            )
    return rows


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for line in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=False)).rstrip())


def cmd_devices(args: argparse.Namespace) -> int:
    records = discover()
    if args.env:
        rows = _env_rows(records)
        if args.json:
            print(json.dumps(rows, indent=2, default=str))
        else:
            _print_table(
                ["PLUGIN", "VARIABLE", "VALUE", "DEFAULT", "HELP"],
                [
                    [
                        r["plugin"],
                        r["set_as"] or r["variable"],  # the spelling the value was read from (CORE_ or VLLM_)
                        "(unset)" if r["value"] is None else r["value"] + (" (INVALID)" if r["error"] else ""),
                        r["default"],
                        r["help"],
                    ]
                    for r in rows
                ],
            )
        errors = [r["error"] for r in rows if r["error"]]
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
        return 1 if errors else 0
    rows = _device_rows(records)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    table = []
    for r in rows:
        status = "available" if r["available"] else f"unavailable: {r['reason']}"
        info = ", ".join(f"{k}={v}" for k, v in r["device_info"].items())
        table.append(
            [
                r["name"],
                r["version"],
                r["device_type"] or "-",
                r["priority"] if r["priority"] is not None else "-",
                status,
                info,
            ]
        )
    _print_table(["NAME", "VERSION", "DEVICE", "PRIORITY", "STATUS", "DEVICE INFO"], table)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from core.server.app import run_server

    config = config_from_args(args)
    return run_server(config, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="core", description="LLM inference and serving engine with pluggable hardware backends"
    )
    parser.add_argument("--version", action="version", version=f"core {__version__}")
    parser.add_argument(
        "--log-level", default=os.environ.get("CORE_LOG_LEVEL", "info"), choices=("debug", "info", "warning", "error")
    )
    sub = parser.add_subparsers(dest="command", required=True)

    devices = sub.add_parser("devices", help="list every discovered backend plugin: available or why not")
    devices.add_argument("--env", action="store_true", help="list every declared environment variable")
    devices.add_argument("--json", action="store_true", help="machine-readable output")
    devices.set_defaults(func=cmd_devices)

    serve = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server",
        description="OpenAI-compatible HTTP server. Memory: the weights plus the KV cache, whose size the start-up "
        "log prints (--kv-cache-memory sets it; by default the platform decides: the CPU backends take "
        "min(8 GiB, 40% of the memory free after the weights)). The cache is allocated at start-up and the "
        "process's resident memory grows to include all of it as requests fill it: size the machine for both.",
    )
    add_engine_args(serve)
    serve.add_argument(
        "--host", default="0.0.0.0", help="address to bind (default: every interface; 127.0.0.1: this machine only)"
    )
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("CORE_API_KEY"))
    serve.add_argument("--max-queue-len", type=int, default=256, help="waiting requests beyond this get 503")
    serve.add_argument("--max-request-bytes", type=int, default=4 << 20, help="larger request bodies get 413")
    serve.add_argument(
        "--chat-template",
        type=chat_template_arg,
        default=None,
        help="a Jinja chat template, or a file holding one, for chat requests that bring none (default: the model's)",
    )
    serve.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="run the chat_template a request brings (a Jinja program from the client), in a sandbox process "
        "within --chat-template-timeout and --chat-template-max-bytes; without it such requests get 400",
    )
    serve.add_argument(
        "--chat-template-timeout",
        type=positive_float,
        default=TemplateBudget.timeout_s,
        help="seconds a request's own chat template may take to render; past it the render is stopped and the request gets 400",
    )
    serve.add_argument(
        "--chat-template-max-bytes",
        type=positive_int,
        default=TemplateBudget.max_output_bytes,
        help="largest rendered chat (UTF-8 bytes), for every template; past it the request gets 400",
    )
    serve.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='answer tool_choice "auto" (the default when a request has tools): the model decides, and '
        "--tool-call-parser reads its calls back",
    )
    serve.add_argument(
        "--tool-call-parser",
        default=None,
        help="how the model writes tool calls: hermes, llama3_json, mistral, pythonic, or a parser another "
        "package registers (entry points core.tool_parsers)",
    )
    serve.add_argument(
        "--allowed-origins", type=json_list, default=["*"], help='CORS: origins allowed, a JSON list (default ["*"])'
    )
    serve.add_argument(
        "--allowed-methods", type=json_list, default=["*"], help='CORS: methods allowed, a JSON list (default ["*"])'
    )
    serve.add_argument(
        "--allowed-headers", type=json_list, default=["*"], help='CORS: headers allowed, a JSON list (default ["*"])'
    )
    serve.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials (cookies, auth)")
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=5.0,
        help="on SIGTERM/SIGINT, seconds the requests in flight get to finish before they are aborted (0: at once)",
    )
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="NAME=PATH",
        help='LoRA adapters to serve (with --enable-lora): name=path, or JSON {"name": ..., "path": ...}',
    )
    serve.set_defaults(func=cmd_serve)

    add_bench_parser(sub)
    return parser


def json_list(value: str) -> list[str]:
    """A flag's JSON list of strings, e.g. ``'["https://app.example"]'``."""
    try:
        items = json.loads(value)
    except json.JSONDecodeError:
        items = None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings such as '[\"*\"]', got {value!r}")
    return items


def positive_float(value: str) -> float:
    number = float(value)
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def chat_template_arg(value: str) -> str:
    """``--chat-template``: a file's text, or the value itself when it is a Jinja template."""
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if "{{" in value or "{%" in value:
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither a file nor a Jinja template")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(levelname)s %(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    try:
        return args.func(args)
    except (PluginError, EnvConfigError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `core devices | head`: the reader left; no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
