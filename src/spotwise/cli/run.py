"""``spotwise run -- CMD ...``: any program (JAX, TensorFlow, a shell script) as the training
process, with the platform's notices forwarded to it and exit 75 when a notice ended it."""

from __future__ import annotations

import typer

HELP = (
    "Run COMMAND as the training process: spotwise watches the platform's interruption notices "
    "for it (AWS, GCP, Azure, SLURM, Kubernetes, SIGTERM/SIGINT/SIGUSR1 to this wrapper), sends "
    "the program's process group --signal and writes $SPOTWISE_NOTICE_FILE (JSON with the "
    "deadline), SIGKILLs what is left at the deadline, and exits 75 ('relaunch me') when a "
    "notice ended the program, whatever code it returned; otherwise with the program's own "
    "code. Put the command after --: spotwise run -- python train.py --lr 3e-4"
)


def register(app: typer.Typer) -> None:
    @app.command(
        "run",
        help=HELP,
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )
    def run(
        command: list[str] = typer.Argument(
            ..., metavar="COMMAND", help="The program and its arguments, after --."
        ),
        signal_name: str = typer.Option(
            "TERM",
            "--signal",
            help="Signal sent to the program's process group on a notice (TERM, INT, USR1...).",
        ),
    ) -> None:
        from spotwise.notices.forward import forward_signal, run_program

        raise typer.Exit(run_program(command, forward=forward_signal(signal_name)))
