"""What a finished job leaves behind: the report, the model and a plot of the job,
written through an object store (a folder locally, S3 on AWS)."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

from ebb.data.format import encode_batch
from ebb.ports.keys import MODEL_KEY, PLOT_KEY, REPORT_KEY
from ebb.ports.objects import ObjectStore


def write_outputs(
    out: ObjectStore,
    report: dict[str, Any],
    replica: dict[str, np.ndarray] | None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Write model.npz (when there is a model), report.json (always), then loss.png (when
    there is a history); returns the keys written (with ``extra``: keys written before, e.g.
    the model artifact's). The model goes before the report, so a reader that finds the
    report finds the model; the plot goes after it, so a plot that cannot be drawn costs
    the plot only (``plot_error`` in the report says why)."""
    files = dict(extra or {})
    if replica is not None:
        out.put(MODEL_KEY, encode_batch(replica))
        files["model"] = MODEL_KEY
    files["report"] = REPORT_KEY
    report["files"] = files

    def put_report() -> None:
        out.put(REPORT_KEY, json.dumps(report, indent=2, default=_jsonable).encode())

    put_report()
    if report.get("history"):
        try:
            out.put(PLOT_KEY, plot_loss(report))
        except Exception as exc:  # matplotlib, a full disk: the report stands
            report["plot_error"] = f"{type(exc).__name__}: {exc}"[:200]
        else:
            files["loss_plot"] = PLOT_KEY
        put_report()
    return files


def write_report_only(out: ObjectStore, report: dict[str, Any]) -> None:
    """report.json alone: no model, no plot (one PUT: a trial ``ebb tune`` pruned in a pack)."""
    report.update({"files": {"report": REPORT_KEY}, "model": None})
    out.put(REPORT_KEY, json.dumps(report, indent=2, default=_jsonable).encode())


def _jsonable(value: object) -> object:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to {REPORT_KEY}")


def plot_loss(report: dict[str, Any]) -> bytes:
    """The job on its clock (PNG bytes): training loss and the held-out scorings against job
    time, the best step kept (with early stopping), the knee the auto-tuner found and every
    scale event, and the active workers on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = report["history"]
    times = [h["time"] for h in hist]
    at = {h["step"]: h["time"] for h in hist}
    loss_name = report.get("loss_name", "loss")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(times, [h["loss"] for h in hist], color="tab:blue", lw=1.2, label=f"training {loss_name}")
    for split, color in (("val", "tab:green"), ("test", "tab:purple")):
        scored = [(h["time"], h[split]) for h in hist if h.get(split) is not None]
        if scored:
            name = "validation" if split == "val" else "test (no validation split)"
            ax.plot(*zip(*scored), color=color, marker="o", ms=3, lw=1.2, label=f"{name} {loss_name}")
    if report.get("model") == "best" and report.get("best_step") in at:
        ax.axvline(at[report["best_step"]], color="tab:green", ls="--", lw=1)
        ax.plot(
            [at[report["best_step"]]],
            [report["best_val"]],
            marker="*",
            ms=12,
            color="tab:green",
            ls="none",
            label=f"best kept (step {report['best_step']})",
        )
    knee = (report.get("autotune") or {}).get("knee_step")
    if knee in at:
        ax.axvline(at[knee], color="tab:gray", ls=":", lw=1.2, label=f"knee (step {knee})")
    marks = {"evict": ("v", "tab:red"), "lost": ("x", "black"), "join": ("^", "tab:olive")}
    for action, (marker, color) in marks.items():
        events = [e["time"] for e in report.get("scale_events") or [] if e.get("action") == action]
        if events:
            ax.plot(
                events,
                [ax.get_ylim()[1]] * len(events),
                marker=marker,
                color=color,
                ls="none",
                ms=7,
                clip_on=False,
                label=f"{action} ({len(events)})",
            )
    kind = (report.get("clock") or {}).get("kind", "host")
    ax.set_xlabel("job time, s (" + ("modelled fleet clock" if kind == "fleet" else "this host's clock") + ")")
    ax.set_ylabel(loss_name)
    ax2 = ax.twinx()
    ax2.step(times, [h["workers"] for h in hist], where="post", color="tab:orange", lw=1, alpha=0.7)
    ax2.set_ylabel("active workers", color="tab:orange")
    ax2.set_ylim(0, max(h["workers"] for h in hist) + 1)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.8)
    spec = report.get("spec", {})
    ax.set_title(
        f"{spec.get('name', '')} {spec.get('model', '')} {spec.get('sync', {}).get('mode', '')}".strip()
        + f": {report.get('status', '')}"
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
