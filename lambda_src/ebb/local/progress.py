"""A live progress line for local jobs, at most 80 columns:

    step 412 ep 4.1 val 0.8312 best 0.8290 ━━━━━━──── patience 2/5 4w $0.0123 host 1:23

validation and the best so far (the training loss when nothing is scored), a bar for the
stop rule expected to end the job (early stopping when a validation split is scored:
scorings since the best against ``stop.patience_evals``), workers, estimated dollars and
the job's elapsed time on its clock (host, or the modelled fleet's). Fields that do not
fit are left out, least useful first.
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import Progress, TextColumn

WIDTH = 80
BAR = 10
# The stop rules as the line names them (ebb.engine.stopping.watch).
RULES = {
    "early_stopping": "patience",
    "target_loss": "at target",
    "max_epochs": "epochs",
    "max_time": "time",
    "budget": "budget",
}


def clock_text(seconds: float) -> str:
    """``83`` -> ``1:23``; an hour or more ``1:02:03``."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def bar(done: float, total: float, width: int = BAR) -> str:
    share = min(1.0, max(0.0, done / total)) if total > 0 else 0.0
    full = round(share * width)
    return "━" * full + "─" * (width - full)


def _count(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def progress_line(record: dict[str, Any], *, loss_name: str, clock: str, val: float | None, width: int = WIDTH) -> str:
    """One closed step as the progress line shows it (``val``: the last held-out scoring)."""
    watch = record.get("watch") or {}
    rule = RULES.get(str(watch.get("rule")), str(watch.get("rule", "")))
    done, total = float(watch.get("done", 0.0)), float(watch.get("total", 0.0))
    best = record.get("best_val")
    # (text, priority: the lowest is left out first)
    fields: list[tuple[str, int]] = [(f"step {record['step']}", 1), (f"ep {record['epoch']:.1f}", 2)]
    if val is not None or best is not None:
        fields += [
            (f"val {val:.4f}" if val is not None else "val -", 8),
            (f"best {best:.4f}" if best is not None else "", 7),
            (f"{loss_name} {record['loss']:.4f}", 0),
        ]
    else:
        fields += [(f"{loss_name} {record['loss']:.4f}", 8)]
    if watch:
        fields += [(bar(done, total), 6), (f"{rule} {_count(done)}/{_count(total)}", 6)]
    fields += [
        (f"{record['active']}w", 4),
        (f"${record['cost_usd']:.4f}", 3) if "cost_usd" in record else ("", 0),
        (f"{clock} {clock_text(record['time'])}", 5),
    ]
    fields = [(text, rank) for text, rank in fields if text]
    while len(" ".join(text for text, _ in fields)) > width:
        fields.remove(min(fields, key=lambda field: field[1]))
    return " ".join(text for text, _ in fields)


class ProgressSink:
    """The metrics sink of ``ebb train``: the line above, redrawn every step on a terminal,
    printed every few seconds of job time elsewhere (a log, CI)."""

    def __init__(self, loss_name: str, *, clock: str = "host", console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.loss_name, self.clock = loss_name, clock
        self.val: float | None = None
        self.progress = Progress(
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
            disable=not self.console.is_terminal and not sys.stderr.isatty(),
        )
        self.task = self.progress.add_task("", total=None)
        self.progress.start()
        self._last_line = -float("inf")

    def step(self, record: dict[str, Any]) -> None:
        if record.get("val") is not None:
            self.val = record["val"]
        line = progress_line(record, loss_name=self.loss_name, clock=self.clock, val=self.val)
        self.progress.update(self.task, description=line)
        if self.progress.disable and record["time"] - self._last_line >= 5:
            self._last_line = record["time"]
            print(line, file=sys.stderr, flush=True)

    def close(self, report: dict[str, Any]) -> None:
        self.progress.stop()
