"""Docker HEALTHCHECK: GET /health from the server running as PID 1, on the port it was given."""

import sys
import urllib.request


def server_port(cmdline: list[str]) -> str:
    """The value of the last ``--port`` in ``cmdline`` (``--port N`` or ``--port=N``), else 8000."""
    port = "8000"
    for i, arg in enumerate(cmdline):
        if arg == "--port" and i + 1 < len(cmdline):
            port = cmdline[i + 1]
        elif arg.startswith("--port="):
            port = arg.split("=", 1)[1]
    return port


if __name__ == "__main__":
    with open("/proc/1/cmdline", "rb") as f:
        port = server_port(f.read().decode().split("\0"))
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3)
    except Exception as exc:  # any failure is "unhealthy": say why in `docker inspect`
        sys.exit(f"unhealthy: {exc}")
