"""``spotwise login URL``: make the job commands talk to a ``spotwise server``."""

from __future__ import annotations

import typer

from spotwise.cli._terminal import literal


def register(app: typer.Typer) -> None:
    @app.command()
    def login(
        url: str = typer.Argument(..., help="the server, e.g. http://127.0.0.1:8642"),
        token: str = typer.Option(
            None,
            "--token",
            help="your token (default: SPOTWISE_TOKEN, else asked for without echo)",
        ),
    ) -> None:
        """Store a server and your token so that launch, jobs, status, logs, cancel and resume
        talk to it instead of driving jobs here.

        The token is checked against the server first and stored in
        $SPOTWISE_HOME/login.json, readable only by you. SPOTWISE_SERVER (with SPOTWISE_TOKEN)
        overrides it for one shell; `spotwise logout` goes back to the embedded mode.
        """
        from rich.console import Console

        from spotwise import settings
        from spotwise.client import Client, Server, base_url, save_login

        secret = token or settings.TOKEN.raw()
        if not secret:
            secret = typer.prompt("token", hide_input=True).strip()
        client = Client(Server(base_url(url), secret, "spotwise login"))
        visible = len(client.jobs())  # a refused token or a silent URL stops here, stores nothing
        path = save_login(client.server.url, secret)
        Console().print(
            literal(
                f"logged in to {client.server.url} ({visible} job(s) visible); stored in {path}"
            )
        )

    @app.command()
    def logout() -> None:
        """Forget the stored server and token: the job commands drive jobs here again."""
        from spotwise.client import login_path

        path = login_path()
        try:
            path.unlink()
        except FileNotFoundError:
            typer.echo("not logged in")
            return
        typer.echo(f"logged out (removed {path})")
