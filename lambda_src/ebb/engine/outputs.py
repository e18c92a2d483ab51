"""What a finished job leaves behind: report.json, the merged model and a loss plot,
written through an object store (a folder locally, S3 on AWS)."""

from __future__ import annotations

import io
import json

import numpy as np

from ebb.stores.base import ObjectStore

REPORT_KEY, MODEL_KEY, PLOT_KEY = "report.json", "model.npz", "loss.png"


def write_outputs(out: ObjectStore, report: dict, replica: dict[str, np.ndarray] | None) -> dict[str, str]:
    """Write report.json (always), model.npz and loss.png (when there is a model); returns
    the keys written. The report goes last: a reader that finds it finds the rest."""
    files = {}
    if replica is not None:
        buf = io.BytesIO()
        np.savez(buf, **replica)
        out.put(MODEL_KEY, buf.getvalue())
        files["model"] = MODEL_KEY
    if report.get("history"):
        out.put(PLOT_KEY, plot_loss(report))
        files["loss_plot"] = PLOT_KEY
    files["report"] = REPORT_KEY
    report["files"] = files
    out.put(REPORT_KEY, json.dumps(report, indent=2, default=_jsonable).encode())
    return files


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to report.json")


def plot_loss(report: dict) -> bytes:
    """Training loss against time, with the active workers on a second axis (PNG bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = report["history"]
    times = [h["time"] for h in hist]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(times, [h["loss"] for h in hist], color="tab:blue", lw=1.2)
    ax.set_xlabel("seconds")
    ax.set_ylabel(f"training {report.get('loss_name', 'loss')}", color="tab:blue")
    ax2 = ax.twinx()
    ax2.step(times, [h["workers"] for h in hist], where="post", color="tab:orange", lw=1)
    ax2.set_ylabel("active workers", color="tab:orange")
    ax2.set_ylim(0, max(h["workers"] for h in hist) + 1)
    spec = report.get("spec", {})
    ax.set_title(f"{spec.get('name', '')} {spec.get('model', '')} {spec.get('sync', {}).get('mode', '')}".strip())
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
