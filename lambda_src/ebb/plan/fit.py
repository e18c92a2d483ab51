"""The planner's two fits (docs/RESULTS-TOOLS.md, "Planning a job").

**Step time against the fleet size P**, from the fleet clock's parts
(``ebb.engine.fleet_clock``). A profile at a few sizes measures, per worker and step, the
CPU (with and without a minibatch fetched and decoded), the CPU inside the update store's
calls, the bytes written and read and the round trips. The CPU parts and the round trips
are fitted as straight lines in the peers ``P - 1`` (a worker reads, decodes and applies
every peer's update); the bytes a worker sends, and reads per peer, as the profiles' mean:
what ISP sends follows the training's progress more than the fleet size, and profiles of
the same steps at different sizes sit at different progress, so a slope across them
extrapolates the progress, not P (it took sparse LR's bytes to zero at 32 workers). The
parts are composed again with the fleet clock's own formula at any P::

    t(P) = barrier + straggle(P) × [(cpu - io) + max(io, write + read) + requests × rtt]
    write = max(sent / link, P × sent / node)    read = max(read / link, P × read / node)

``straggle`` is the barrier's wait for the slowest worker: the measured step time over
the composed one, fitted as ``a + b ln P`` (the expected maximum of P similar times grows
about as ``sqrt(ln P)``; a log line through two or three sizes is as much as they tell).

**Steps against P**: for a fixed number of epochs the engine's rule is exact (a step
consumes P minibatches). For a target on the validation metric, the profile's scorings
are fitted in the engine's unit of progress, one worker's epoch (``ebb.engine.cadence``:
under ``sync.combine`` mean a step is one worker's step, under sum P workers' steps), so
one curve serves every P; each profiled size's own fit gives the spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ebb.engine.fleet_clock import Links, WorkerStep

MB = 1e6


@dataclass(frozen=True)
class SizeSample:
    """What a profile measured at one fleet size: means per worker and step (fetch steps,
    with a minibatch read and decoded, apart from cached ones), and the mean fleet-clock
    step time between steps (the first step of a wave, with its cold start, left out)."""

    workers: int
    cpu_s: float  # a step's CPU without a fetch (NaN: every measured step fetched)
    fetch_cpu_s: float  # the extra CPU of a step that fetches and decodes its minibatch (NaN: not seen apart)
    io_cpu_s: float
    sent_bytes: float
    read_bytes: float
    requests: float
    step_s: float  # measured fleet-clock seconds per step
    miss_share: float = 1.0  # share of the measured worker-steps that fetched
    fetching_cpu_s: float = math.nan  # a fetching step's CPU
    first_extra_s: float = 0.0  # a wave's first step beyond the cold start and a step (state set-up)

    def to_dict(self) -> dict:
        return asdict(self)


def sample_of(
    workers: int,
    steps: Sequence[Mapping[int, WorkerStep]],
    gets: Sequence[Mapping[int, int]],
    step_s: float,
    first_extra_s: float = 0.0,
) -> SizeSample:
    """Reduce a profile's per-step, per-worker measures (``gets``: minibatch fetches of
    each worker-step) to the means the fit uses."""
    cpu_hit, cpu_miss, io, sent, read, req = [], [], [], [], [], []
    for measured, fetched in zip(steps, gets):
        for w, m in measured.items():
            (cpu_miss if fetched.get(w, 0) else cpu_hit).append(m.cpu_s)
            io.append(min(m.io_cpu_s, m.cpu_s))
            sent.append(m.sent_bytes)
            read.append(m.read_bytes)
            req.append(m.requests)
    if not io:
        raise ValueError(f"the profile at {workers} workers measured no steps")
    miss_mean = float(np.mean(cpu_miss)) if cpu_miss else float(np.mean(cpu_hit))
    hit_mean = float(np.mean(cpu_hit)) if cpu_hit else math.nan
    return SizeSample(
        workers=workers,
        cpu_s=hit_mean,
        fetch_cpu_s=max(0.0, miss_mean - hit_mean) if cpu_hit and cpu_miss else math.nan,
        io_cpu_s=float(np.mean(io)),
        sent_bytes=float(np.mean(sent)),
        read_bytes=float(np.mean(read)),
        requests=float(np.mean(req)),
        step_s=float(step_s),
        miss_share=len(cpu_miss) / (len(cpu_miss) + len(cpu_hit)),
        fetching_cpu_s=miss_mean,
        first_extra_s=max(0.0, first_extra_s),
    )


@dataclass(frozen=True)
class Line:
    """``a + b × x``."""

    a: float
    b: float

    def __call__(self, x: float) -> float:
        return self.a + self.b * x


def _line(xs: Sequence[float], ys: Sequence[float], *, floor: float | None = 0.0) -> Line:
    """Least-squares line (a constant through one point); with ``floor`` the line is kept
    at or above it over x ≥ 0 (a negative slope that would cross it is flattened)."""
    x, y = np.asarray(xs, float), np.asarray(ys, float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if y.size == 0:
        return Line(0.0, 0.0)
    if y.size == 1 or np.ptp(x) == 0:
        return Line(float(np.mean(y)), 0.0)
    b, a = np.polyfit(x, y, 1)
    if floor is not None and a < floor:
        a, b = floor, max(0.0, float(np.sum((x) * (y - floor)) / np.sum(x * x)))
    return Line(float(a), float(b))


@dataclass(frozen=True)
class StepModel:
    """Step time at any fleet size from the fitted parts (CPU and requests lines in
    ``P - 1``, bytes sent and read per peer constants, the straggle a line in ``ln P``)."""

    cpu: Line
    fetch_cpu: float
    io_cpu: Line
    sent: Line
    read_per_peer: Line
    requests: Line
    straggle: Line
    links: Links
    sizes: tuple[int, ...] = ()
    first_extra: Line = Line(0.0, 0.0)  # a round's first step beyond a step, by peers

    def parts(self, workers: int, miss: float = 0.0) -> dict[str, float]:
        """Seconds of each part of a step at ``workers``, a worker fetching a minibatch with
        probability ``miss`` (the barrier waits for the step's slowest, so the step pays the
        fetch when any worker fetches)."""
        peers = workers - 1
        any_fetch = 1.0 - (1.0 - miss) ** workers
        cpu = max(0.0, self.cpu(peers)) + self.fetch_cpu * any_fetch
        io = min(max(0.0, self.io_cpu(peers)), cpu)
        sent = max(0.0, self.sent(peers))
        read = max(0.0, self.read_per_peer(peers)) * peers
        link, node = self.links.link_mb_s * MB, self.links.node_mb_s * MB
        write_s = max(sent / link, workers * sent / node)
        read_s = max(read / link, workers * read / node)
        wire = max(io, write_s + read_s) - io
        rtt = max(0.0, self.requests(peers)) * self.links.rtt_ms / 1e3
        base = cpu + wire + rtt
        straggle = max(1.0, self.straggle(math.log(workers)))
        return {
            "cpu": cpu * straggle,
            "wire": wire * straggle,
            "rtt": rtt * straggle,
            "barrier": self.links.barrier_ms / 1e3,
            "total": self.links.barrier_ms / 1e3 + base * straggle,
        }

    def step_seconds(self, workers: int, miss: float = 0.0) -> float:
        return self.parts(workers, miss)["total"]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["links"] = asdict(self.links)
        return d


def fit_step_model(samples: Sequence[SizeSample], links: Links, fetch_cpu_s: float | None = None) -> StepModel:
    """Fit the step's parts to profiles at one or more fleet sizes (more sizes, better
    slopes: one size gives constants, so a step that grows with the peers is missed).
    ``fetch_cpu_s``: a minibatch's fetch and decode, measured apart, where the profiles
    saw too few cached steps to tell it from the rest of the step."""
    if not samples:
        raise ValueError("the step-time fit needs at least one profiled fleet size")
    samples = sorted(samples, key=lambda s: s.workers)
    peers = [s.workers - 1 for s in samples]
    fetch = [s.fetch_cpu_s for s in samples if math.isfinite(s.fetch_cpu_s)]
    fetch_cpu = float(np.mean(fetch)) if fetch else (fetch_cpu_s or 0.0)
    # Where a size measured no cached step its CPU is the fetching one less the fetch.
    cpu = [s.cpu_s if math.isfinite(s.cpu_s) else max(0.0, s.fetching_cpu_s - fetch_cpu) for s in samples]
    read_pp = [s.read_bytes / p if p > 0 else math.nan for s, p in zip(samples, peers)]
    model = StepModel(
        cpu=_line(peers, cpu),
        fetch_cpu=fetch_cpu,
        io_cpu=_line(peers, [s.io_cpu_s for s in samples]),
        sent=Line(float(np.mean([s.sent_bytes for s in samples])), 0.0),
        read_per_peer=Line(
            float(np.mean(finite)) if (finite := [r for r in read_pp if math.isfinite(r)]) else 0.0, 0.0
        ),
        requests=_line(peers, [s.requests for s in samples]),
        straggle=Line(1.0, 0.0),
        links=links,
        sizes=tuple(s.workers for s in samples),
        first_extra=_line(peers, [s.first_extra_s for s in samples]),
    )
    barrier = links.barrier_ms / 1e3
    ratios = []
    for s in samples:
        base = model.step_seconds(s.workers, s.miss_share) - barrier
        ratios.append((s.step_s - barrier) / base if base > 0 else 1.0)
    straggle = _line([math.log(s.workers) for s in samples], ratios, floor=1.0)
    return StepModel(**{**model.__dict__, "straggle": straggle})


# -- steps ----------------------------------------------------------------------------


def miss_share(epoch: float, workers: int, cached_share: float) -> float:
    """The chance that a worker's minibatch at ``epoch`` is not in its cache: each epoch
    re-stripes the shuffled parts, so a part was read by this worker in an earlier epoch
    with chance 1 - (1 - 1/P)^epochs; a cache holding ``cached_share`` of the parts keeps
    at most that share."""
    seen = 1.0 - (1.0 - 1.0 / workers) ** math.floor(epoch)
    return 1.0 - min(seen, cached_share)


def epoch_steps(epochs: float, num_parts: int, workers: int) -> int:
    """Steps to train ``epochs`` passes at ``workers``: a step consumes one minibatch per worker."""
    return max(1, math.ceil(epochs * num_parts / workers - 1e-9))


@dataclass(frozen=True)
class Progress:
    """Steps to the validation target in the engine's unit of progress (one worker's
    epochs, ``units``), with the spread across the profiled sizes (``low``, ``high``)."""

    units: float
    low: float
    high: float
    per_size: dict[int, float]

    def to_dict(self) -> dict:
        return asdict(self)


def fit_progress(curves: Mapping[int, tuple[Sequence[float], Sequence[float]]], target: float) -> Progress:
    """Where each profiled size's validation curve (``{P: (progress units, values)}``)
    reaches ``target``: a power law ``v = v∞ + A (u + 1)^-β`` fitted to each, solved for
    the target. Raises ValueError when no profile's curve reaches it (the profile is too
    short to say; run it longer or plan by epochs)."""
    from scipy.optimize import curve_fit

    def law(u, v_inf, a, beta):
        return v_inf + a * np.power(u + 1.0, -beta)

    reached: dict[int, float] = {}
    for workers, (units, values) in curves.items():
        u, v = np.asarray(units, float), np.asarray(values, float)
        if u.size < 4:
            continue
        hit = np.nonzero(v <= target)[0]
        if hit.size:  # reached within the profile: interpolate between the scorings around it
            i = int(hit[0])
            if i == 0:
                reached[workers] = float(u[0])
            else:
                frac = (v[i - 1] - target) / (v[i - 1] - v[i])
                reached[workers] = float(u[i - 1] + frac * (u[i] - u[i - 1]))
            continue
        try:
            (v_inf, a, beta), _ = curve_fit(
                law,
                u,
                v,
                p0=(float(v.min()) * 0.9, float(v.max() - v.min()) + 1e-6, 1.0),
                maxfev=4000,
                bounds=([0.0, 0.0, 0.05], [float(v.min()), np.inf, 5.0]),
            )
        except (RuntimeError, ValueError):
            continue
        if target <= v_inf or a <= 0:
            continue
        reached[workers] = float(((target - v_inf) / a) ** (-1.0 / beta) - 1.0)
    if not reached:
        raise ValueError(
            f"no profiled curve reaches the target {target:g} (the fitted floors lie above it): profile longer "
            "(--profile-steps), or plan by --epochs"
        )
    values = sorted(reached.values())
    return Progress(units=float(np.median(values)), low=values[0], high=values[-1], per_size=reached)
