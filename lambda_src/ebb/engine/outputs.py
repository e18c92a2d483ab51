"""What a finished job leaves behind: report.json, the merged model and a loss plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_outputs(out_dir: Path, report: dict, replica: dict[str, np.ndarray] | None) -> dict[str, str]:
    """Write report.json (always), model.npz and loss.png (when there is a model)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"report": str(out_dir / "report.json")}
    if replica is not None:
        np.savez(out_dir / "model.npz", **replica)
        files["model"] = str(out_dir / "model.npz")
    if report.get("history"):
        files["loss_plot"] = str(plot_loss(out_dir / "loss.png", report))
    report["files"] = files
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=_jsonable))
    return files


def _jsonable(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to report.json")


def plot_loss(path: Path, report: dict) -> Path:
    """Training loss against time, with the active workers on a second axis."""
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
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
