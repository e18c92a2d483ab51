"""A live progress line for local jobs: step, epoch, loss, workers, MB exchanged, $, elapsed."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class ProgressSink:
    def __init__(self, total_epochs: float, loss_name: str, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.loss_name = loss_name
        self.mb = 0.0
        self.progress = Progress(TextColumn("[bold]epoch {task.completed:.2f}/{task.total:g}"), BarColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console,
                                 disable=not self.console.is_terminal and not sys.stderr.isatty(), transient=False)
        self.task = self.progress.add_task("", total=total_epochs)
        self.progress.start()
        self._last_line = 0.0

    def step(self, r: dict) -> None:
        self.mb += (r["bytes_sent"] + r["bytes_received"]) / 1e6
        cost = f" ${r['cost_usd']:.4f}" if "cost_usd" in r else ""
        desc = (f"round {r.get('round', 0)} step {r['step']} {self.loss_name} {r['loss']:.4f} workers {r['active']} "
                f"{self.mb:.1f} MB sent {r['sent_fraction']:.0%}{cost}")
        self.progress.update(self.task, completed=min(r["epoch"], self.progress.tasks[0].total), description=desc)
        if self.progress.disable and r["time"] - self._last_line >= 5:
            # Not a terminal (CI, a log file): a plain line every few seconds instead.
            self._last_line = r["time"]
            print(f"[{r['time']:7.1f}s] epoch {r['epoch']:.2f} {desc}", file=sys.stderr, flush=True)

    def close(self, report: dict) -> None:
        self.progress.stop()
