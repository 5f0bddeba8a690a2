"""``spotwise dashboard``: the job store in a browser, live (see telemetry/dashboard/app.py)."""

from __future__ import annotations

import socket

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def dashboard(
        host: str = typer.Option(
            "127.0.0.1", "--host", help="address to listen on (loopback by default)"
        ),
        port: int = typer.Option(8787, "--port", help="TCP port (0 picks a free one)"),
        allow_host: list[str] = typer.Option(
            [],
            "--allow-host",
            help="another name the browser may use for this server (Host header check)",
        ),
    ) -> None:
        """Jobs and their attempts, costs, goodput, checkpoints, loss and GPU charts, live.

        Also serves the controller's Prometheus metrics at /metrics. Read only, except that a
        job can be cancelled from its page (with confirmation).
        """
        from spotwise.registry import require

        uvicorn = require("uvicorn", "dashboard", "spotwise dashboard")
        require("starlette", "dashboard", "spotwise dashboard")
        from spotwise.cli.jobs import _spawn_controller
        from spotwise.control.ownership import controller_alive
        from spotwise.control.store import Store
        from spotwise.server.serve import listen
        from spotwise.telemetry.dashboard.app import create_app

        store = Store()

        def on_cancel(job_id: str) -> None:
            job = store.job(job_id)
            if not controller_alive(job):
                _spawn_controller(job)  # someone must carry the cancel out

        names = [host] if host not in ("0.0.0.0", "::") else []
        web = create_app(store, allowed_hosts=[*names, *allow_host], on_cancel=on_cancel)
        sock = listen(host, port)
        shown = f"[{host}]" if sock.family == socket.AF_INET6 else host
        typer.echo(
            f"spotwise dashboard on http://{shown}:{sock.getsockname()[1]}/ (Ctrl-C to stop)",
            err=False,
        )
        config = uvicorn.Config(
            web, log_level="warning", timeout_graceful_shutdown=1, lifespan="off"
        )
        uvicorn.Server(config).run(sockets=[sock])
