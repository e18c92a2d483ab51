"""Is the fleet clock right? The same job on real shaped links, timed by the wall and by the model.

Root only, never part of the test suite. Builds a small private network of Linux network
namespaces joined by a bridge (addresses in 10.213.0.0/24, nothing else touched):

    ebbfp-redis  redis-server 10.213.0.1  --veth, unshaped (or --node-mb-s)------+
    ebbfp-w0     worker 0     10.213.0.10 --veth, tbf at the link rate both ways--+-- bridge in ebbfp-hub
    ebbfp-w1     worker 1     10.213.0.11 --veth, tbf at the link rate both ways--+
    (root ns)    supervisor   10.213.0.2  --veth, unshaped-------------------------+

Each worker process is forked by the local runner and, through the runner's
``child_setup`` hook, enters its own namespace (``setns``) before it opens a connection, so
every byte it sends or reads crosses its own token-bucket-limited link (``tbf`` on the
egress of both ends of its veth: upload and download). The supervisor stays here. The
buckets hold 0.25 ms of the rate, so a link is a rate as the clock assumes, and every
sender hands its veth TCP segments no larger than a bucket (``gso_max_size``), so tbf
never splits them into single frames: the host's CPU is the workers', not the network
emulation's.

For each link rate and sync model the job runs to a fixed number of steps with
``clock.kind: fleet`` and the clock's parameters set to the shaped network's: the link
is the tbf rate's TCP payload (× 1448/1514), the round trip the Redis PING measured from a
worker's namespace. One run gives both numbers: real = host time from the first closed
step to the last (``history[].host_time``), fleet = the fleet clock over the same steps
(``history[].time``). Target: within 15%. ``--unshaped`` adds runs on unshaped links,
whose gap (real − fleet per step) is the host's per-step cost no link explains; the
summary's "calibrated" error adds it to the fleet clock (see ``summarise``).

    sudo python bench/fleet_proof.py --unshaped      # PMF, BSP/ISP/SSP, 25/75/200 MB/s, twice
    sudo python bench/fleet_proof.py --model sparse_lr --unshaped   # a Criteo-shaped set
    sudo python bench/fleet_proof.py --probe         # only measure the shaped links
    sudo python bench/fleet_proof.py --cleanup       # remove leftovers of a killed run
    python bench/fleet_proof.py --summarise bench/results/fleet_proof/pmf.json   # re-print a run

Every namespace and veth is removed at the end, on Ctrl-C and on error.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, result_path, write_json  # noqa: E402

PREFIX = "ebbfp"
SUBNET = "10.213.0"
REDIS_IP, SUPERVISOR_IP = f"{SUBNET}.1", f"{SUBNET}.2"
REDIS_PORT = 6379
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/var/run/netns")
BURST_MS = 0.25
TBF_LATENCY = "50ms"  # how long a packet may queue behind the bucket before tbf drops it


def worker_ip(worker: int) -> str:
    return f"{SUBNET}.{10 + worker}"


def ns_name(role: str) -> str:
    return f"{PREFIX}-{role}"


def sh(*cmd: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command (in namespace ``ns``); a failure raises with the command and its stderr."""
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    done = subprocess.run(full, capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"`{' '.join(full)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def cleanup() -> list[str]:
    """Remove every namespace and root-side veth this script creates (by prefix); returns what it removed."""
    removed = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(f"{PREFIX}-"):
            # Killing the namespace's processes first: a namespace lives while a process is in it.
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", name, check=False)
            removed.append(f"netns {name}")
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        dev = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if dev.startswith(f"{PREFIX}-"):
            sh("ip", "link", "del", dev, check=False)
            removed.append(f"link {dev}")
    return removed


def burst_bytes(mb_s: float, burst_ms: float) -> int:
    """The token bucket's size: ``burst_ms`` of the rate (a few frames at least). A bucket
    refills while a worker computes, so whatever it holds crosses the link at once: kept
    small, the link is a rate, as the fleet clock assumes."""
    return max(4 * FRAME_BYTES, int(mb_s * 1e6 * burst_ms / 1e3))


FRAME_BYTES = 1514
GSO_DEFAULT_BYTES = 65536


def segment_bytes(bucket: int) -> int:
    """The largest TCP segment a sender may hand its veth (``gso_max_size``) so that tbf
    passes it whole: one frame short of the bucket. The kernel builds segments of up to
    64 KB (segmentation offload) and tbf splits any larger than its bucket into 1.5 KB
    frames, each then crossing the veth, the bridge and the receiver's stack alone: with
    0.25 ms buckets that cost the redis-server 19 ms of CPU a step (PMF BSP, 75 MB/s) on
    the 2 cores the workers run on, and the host, not the link, set the pace."""
    return max(2 * FRAME_BYTES, min(GSO_DEFAULT_BYTES, bucket - FRAME_BYTES))


def tbf(dev: str, ns: str | None, mb_s: float | None, burst_ms: float) -> None:
    """Shape the egress of ``dev`` to ``mb_s`` MB/s (10^6 bytes) with a token bucket; None: unshaped."""
    if mb_s is None:
        sh("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
        return
    # tc's "mbps" is megaBYTES per second, "mbit" megabits: say it in bits to leave no doubt.
    sh(
        "tc",
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{mb_s * 8:g}mbit",
        "burst",
        str(burst_bytes(mb_s, burst_ms)),
        "latency",
        TBF_LATENCY,
        ns=ns,
    )


class ShapedNet:
    """The namespaces, bridge and veths above; ``shape()`` sets the link and node rates."""

    def __init__(self, workers: int, burst_ms: float):
        self.workers, self.burst_ms = workers, burst_ms
        self.gso_bytes = GSO_DEFAULT_BYTES
        self.hub = ns_name("hub")

    def up(self) -> ShapedNet:
        cleanup()
        atexit.register(cleanup)  # also on an exception that escapes main()
        sh("ip", "netns", "add", self.hub)
        sh("ip", "link", "add", "br0", "type", "bridge", ns=self.hub)
        sh("ip", "link", "set", "br0", "up", ns=self.hub)
        self._port("redis", ns_name("redis"), REDIS_IP)
        for w in range(self.workers):
            self._port(f"w{w}", ns_name(f"w{w}"), worker_ip(w))
        self._port("sup", None, SUPERVISOR_IP)
        return self

    def _port(self, role: str, ns: str | None, ip: str) -> None:
        """A veth from ``ns`` (None: this namespace) to the bridge, address ``ip``/24."""
        end, hub_end = f"{PREFIX}-{role}", f"{PREFIX}-h{role}"
        if ns:
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("ip", "link", "add", end, "type", "veth", "peer", "name", hub_end)
        sh("ip", "link", "set", hub_end, "netns", self.hub)
        sh("ip", "link", "set", hub_end, "master", "br0", "up", ns=self.hub)
        if ns:
            sh("ip", "link", "set", end, "netns", ns)
        sh("ip", "addr", "add", f"{ip}/24", "dev", end, ns=ns)
        sh("ip", "link", "set", end, "up", ns=ns)

    def shape(self, link_mb_s: float | None, node_mb_s: float | None) -> None:
        """Every worker's link (both directions) at ``link_mb_s``; the Redis node's at ``node_mb_s``."""
        for w in range(self.workers):
            tbf(f"{PREFIX}-w{w}", ns_name(f"w{w}"), link_mb_s, self.burst_ms)
            tbf(f"{PREFIX}-hw{w}", self.hub, link_mb_s, self.burst_ms)
        tbf(f"{PREFIX}-redis", ns_name("redis"), node_mb_s, self.burst_ms)
        tbf(f"{PREFIX}-hredis", self.hub, node_mb_s, self.burst_ms)
        # Senders (workers, redis-server) segment for the smallest bucket any byte crosses.
        buckets = [burst_bytes(r, self.burst_ms) for r in (link_mb_s, node_mb_s) if r is not None]
        gso = segment_bytes(min(buckets)) if buckets else GSO_DEFAULT_BYTES
        for dev, ns in [
            *((f"{PREFIX}-w{w}", ns_name(f"w{w}")) for w in range(self.workers)),
            (f"{PREFIX}-redis", ns_name("redis")),
        ]:
            sh("ip", "link", "set", "dev", dev, "gso_max_size", str(gso), ns=ns)
        self.gso_bytes = gso

    def down(self) -> None:
        cleanup()


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into network namespace ``name`` (Python has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(NETNS_DIR / name) as f:
        if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")


def enter_worker_netns(worker: int) -> None:
    """The runner's ``child_setup``: worker ``worker`` goes behind its own shaped link."""
    name = ns_name(f"w{worker}")
    if not (NETNS_DIR / name).exists():
        raise RuntimeError(
            f"no network namespace {name} for worker {worker}: the shaped network has "
            "fewer worker links than the job has workers"
        )
    enter_netns(name)


class RedisInNetns:
    """redis-server in the ``ebbfp-redis`` namespace, AUTH required (protected mode refuses
    clients that are not on loopback otherwise); stopped by pid."""

    def __init__(self):
        self.password = secrets.token_hex(16)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{REDIS_IP}:{REDIS_PORT}/0"

    def start(self) -> RedisInNetns:
        import redis

        from ebb.local.redis_server import die_with_parent, redis_binary, wait_until_ready

        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns_name("redis"),
                redis_binary(),
                "--port",
                str(REDIS_PORT),
                "--bind",
                REDIS_IP,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                "/tmp",
                "--protected-mode",
                "yes",
                "--requirepass",
                self.password,
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        wait_until_ready(self.proc, redis.Redis.from_url(self.url), 10, "in its network namespace")
        return self

    def stop(self) -> None:
        from ebb.local.redis_server import stop_process

        if self.proc is not None:
            stop_process(self.proc)


def _probe_child(url: str, worker: int, mb: int, pings: int, out) -> None:
    """In worker ``worker``'s namespace: Redis round trip and payload throughput both ways."""
    import redis

    enter_worker_netns(worker)
    r = redis.Redis.from_url(url, socket_timeout=60)
    r.ping()
    rtts = []
    for _ in range(pings):
        t0 = time.perf_counter()
        r.ping()
        rtts.append(time.perf_counter() - t0)
    blob = os.urandom(mb * 1_000_000)
    key = f"probe-{worker}"
    ups, downs = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        r.set(key, blob)
        ups.append(mb / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        assert len(r.get(key)) == len(blob)
        downs.append(mb / (time.perf_counter() - t0))
    r.delete(key)
    out.send(
        {
            "rtt_ms_median": 1e3 * statistics.median(rtts),
            "rtt_ms_p90": 1e3 * sorted(rtts)[int(0.9 * pings)],
            "up_mb_s": statistics.median(ups),
            "down_mb_s": statistics.median(downs),
        }
    )


def _sized_child(url: str, worker: int, barrier, out, refill_s: float, repeats: int = 20) -> None:
    """In worker ``worker``'s namespace, in step with every other worker's child: SET then
    GET a payload of each size at the same moment as the others, as a barrier step moves
    its bytes (every link busy, the one redis-server serving them all). Each transfer
    starts from a full bucket (``refill_s`` idle first), as a step's does: a worker
    computes for milliseconds between its transfers."""
    import redis

    enter_worker_netns(worker)
    r = redis.Redis.from_url(url, socket_timeout=60)
    r.ping()
    blob, key, rates = os.urandom(max(SIZED_PROBE_BYTES)), f"sized-{worker}", {}
    for size in SIZED_PROBE_BYTES:
        samples = []
        for _ in range(repeats):
            time.sleep(refill_s)
            barrier.wait()
            t0 = time.perf_counter()
            r.set(key, blob[:size])
            took = time.perf_counter() - t0
            time.sleep(refill_s)
            barrier.wait()
            t0 = time.perf_counter()
            r.get(key)
            took += time.perf_counter() - t0
            samples.append(2 * size / 1e6 / took)
        rates[size] = statistics.median(samples)
    r.delete(key)
    out.send(rates)


def sized_probe(url: str, workers: int, refill_s: float = 0.0) -> dict[int, float]:
    """A step moves far less than 20 MB at a time, and every worker moves its bytes at once:
    the rate one worker's SET + GET of each size gets then (TCP against the bucket, the
    shared redis-server), the mean over workers, MB/s."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers)
    pipes, procs = [], []
    for w in range(workers):
        recv, send = ctx.Pipe(duplex=False)
        procs.append(ctx.Process(target=_sized_child, args=(url, w, barrier, send, refill_s), daemon=True))
        pipes.append(recv)
        procs[-1].start()
    for p in procs:
        p.join(300)
    if any(p.exitcode != 0 for p in procs) or not all(r.poll() for r in pipes):
        raise RuntimeError("the concurrent transfer probe failed")
    per_worker = [r.recv() for r in pipes]
    return {size: statistics.mean(rates[size] for rates in per_worker) for size in SIZED_PROBE_BYTES}


SIZED_PROBE_BYTES = (16_000, 64_000, 256_000, 1_000_000)


def sized_rate(probe_row: dict, transfer_bytes: float) -> float:
    """The probe's rate for a transfer of ``transfer_bytes`` (interpolated on log size)."""
    import math

    points = sorted((int(k), v) for k, v in probe_row["sized_mb_s"].items())
    if transfer_bytes <= points[0][0]:
        return points[0][1]
    for (s0, r0), (s1, r1) in zip(points, points[1:]):
        if transfer_bytes <= s1:
            f = (math.log(transfer_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return r0 + f * (r1 - r0)
    return points[-1][1]


def transfer_sizes(reports: list[dict]) -> list[int]:
    """Every write and read a worker's link carried in one go (a step's, per worker)."""
    return [n for r in reports for n in (r["sent_bytes"], r["read_bytes"]) if n]


def sized_link(probe_row: dict, sizes: list[int]) -> float:
    """The rate the run's transfers got on this link: their bytes over the time the probe's
    rate at each one's size gives it. Times add up, rates do not: the rate at the mean size
    misjudges a run whose payloads vary across a bucket's worth (ISP's do)."""
    if not sizes:
        return sized_rate(probe_row, 0)
    return sum(sizes) / sum(n / sized_rate(probe_row, n) for n in sizes)


def probe(url: str, worker: int = 0, mb: int = 20, pings: int = 500) -> dict:
    """Measure worker ``worker``'s link as the engine sees it (a forked child in its namespace)."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_probe_child, args=(url, worker, mb, pings, send), daemon=True)
    p.start()
    p.join(300)
    if p.exitcode != 0 or not recv.poll():
        raise RuntimeError(f"the link probe of worker {worker} failed (exit code {p.exitcode})")
    return recv.recv()


def cpu_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait


def parse_rates(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


# TCP over a 1500-byte MTU: 1448 bytes of payload (timestamps on) per 1514-byte frame, and
# tbf counts frames. The clock's link is what the shaped link carries of payload; the CPU a
# worker spends moving bytes is in its measured CPU already.
PAYLOAD_SHARE = 1448 / 1514
UNSHAPED_MB_S = 1e6  # the clock's link for an unshaped veth: its time is the workers' CPU (and rtt)
NODE_UNSHAPED_MB_S = 10_000.0  # an unshaped node: never the bound (each worker's own link is)
RUNS = Path(__file__).resolve().parent / "data" / "runs"
SYNCS = {"bsp": {"sync.mode": "bsp"}, "isp": {"sync.mode": "isp"}, "ssp": {"sync.mode": "ssp", "sync.slack": 3}}
BENCH_NICE = -20  # the benchmark before the machine's other load (workers: -15 after the engine's +5)


def raise_priority(pid: int = 0) -> None:
    """Let this benchmark's processes run before the machine's other load, so the wall time
    measures the links, not the neighbours (the engine then makes workers 5 nicer). With
    the scheduler's autogroups (one per session) a process's nice only ranks it inside its
    session's group: the group's own nice is what ranks it against other sessions."""
    os.setpriority(os.PRIO_PROCESS, pid, BENCH_NICE)
    group = Path(f"/proc/{pid or 'self'}/autogroup")
    if group.exists():
        group.write_text(str(BENCH_NICE))


def worker_setup(worker: int, priority: bool = True) -> None:
    """The runner's ``child_setup``: priority, then behind worker ``worker``'s shaped link."""
    if priority:
        raise_priority()
    enter_worker_netns(worker)


class Recorder:
    """The supervisor's ``measure_of`` hook, used here only to keep every StepReport it reads
    (the measures go to the fleet clock unchanged), so the model can be re-run offline."""

    def __init__(self):
        self.reports: list[dict] = []

    def __call__(self, report):
        from ebb.engine.fleet_clock import WorkerStep

        self.reports.append(
            report.model_dump(
                include={
                    "worker",
                    "step",
                    "cpu_seconds",
                    "io_cpu_seconds",
                    "sent_bytes",
                    "read_bytes",
                    "requests",
                    "timing",
                }
            )
        )
        return WorkerStep.of(report)


def phase_ms(reports: list[dict], how=statistics.mean) -> dict[str, float]:
    """A worker's step phases (fetch, compute, filter, write, apply, wait, read), ms, over every report."""
    phases: dict[str, list[float]] = {}
    for r in reports:
        for name, seconds in r["timing"].items():
            phases.setdefault(name, []).append(1e3 * seconds)
    return {name: round(how(v), 3) for name, v in phases.items()}


def process_cpu(pid: int | str = "self") -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replay(reports: list[dict], links, slack: int) -> float:
    """The fleet clock's span from the first closed step to the last, recomputed from the
    recorded reports with other ``links`` (the engine's arithmetic)."""
    from ebb.engine.fleet_clock import FleetTimeline, WorkerStep

    by_step: dict[int, dict[int, WorkerStep]] = {}
    for r in reports:
        by_step.setdefault(r["step"], {})[r["worker"]] = WorkerStep(
            r["cpu_seconds"], r["sent_bytes"], r["read_bytes"], r["requests"], r["io_cpu_seconds"]
        )
    timeline = FleetTimeline(links, slack)
    steps = sorted(by_step)
    timeline.launch(by_step[steps[0]])
    first = timeline.close(steps[0], by_step[steps[0]])
    last = first
    for k in steps[1:]:
        last = timeline.close(k, by_step[k])
    return last - first


def io_cpu_ms_per_mb(reports: list[dict]) -> dict[int, float]:
    """CPU a worker spent inside the update store's calls per MB it moved (the engine's
    ``io_cpu_seconds``): on a slow link the client spends more CPU waiting on the socket."""
    cpu: dict[int, float] = {}
    moved: dict[int, int] = {}
    for r in reports:
        cpu[r["worker"]] = cpu.get(r["worker"], 0.0) + r["io_cpu_seconds"]
        moved[r["worker"]] = moved.get(r["worker"], 0) + r["sent_bytes"] + r["read_bytes"]
    return {w: 1e9 * cpu[w] / moved[w] for w in cpu if moved[w]}


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (link, sync): means over the repeats, and the spread of the error.

    ``calibrated``: the fleet clock plus, per step, what the unshaped run of the same sync
    model measured beyond it (the host's per-step cost no link explains: barrier wake-ups,
    the supervisor and redis-server on the workers' cores): what is then left of the
    error is the network model's own."""
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        cells.setdefault((r["link_mb_s"] or 0.0, r["sync"]), []).append(r)
    out = []
    for (link, sync), rs in sorted(cells.items(), key=lambda kv: (kv[0][0] or float("inf"), kv[0][1])):
        real, fleet = statistics.mean(r["real_s"] for r in rs), statistics.mean(r["fleet_s"] for r in rs)
        errors = [r["error_pct"] for r in rs]
        sized = statistics.mean(r["fleet_s_sized_link"] for r in rs)
        out.append(
            {
                "link": f"{link:g}" if link else "unshaped",
                "sync": sync,
                "steps": rs[0]["steps"],
                "runs": len(rs),
                "real_s": real,
                "fleet_s": fleet,
                "error_pct": 100 * (fleet - real) / real,
                "error_pct_range": f"{min(errors):+.0f}..{max(errors):+.0f}",
                "fleet_s_sized": sized,
                "error_pct_sized": 100 * (sized - real) / real,
                "overhead_ms_per_step": statistics.mean(r["overhead_ms_per_step"] for r in rs),
                "job_cpu_share": statistics.mean(r["job_cpu_share"] for r in rs),
                "barrier_first_worker_ms": statistics.mean(r["barrier_first_worker_ms"] or 0.0 for r in rs),
            }
        )
    unshaped = {c["sync"]: c["overhead_ms_per_step"] for c in out if c["link"] == "unshaped"}
    for c in out:
        if c["link"] != "unshaped" and c["sync"] in unshaped:
            c["calibrated_s"] = c["fleet_s"] + (c["steps"] - 1) * unshaped[c["sync"]] / 1e3
            c["error_pct_calibrated"] = 100 * (c["calibrated_s"] - c["real_s"]) / c["real_s"]
    return out


def print_summary(summary: list[dict]) -> str:
    """The per-cell table and the verdict line (returned)."""
    print_table(
        summary,
        [
            ("link", "link MB/s"),
            ("sync", "sync"),
            ("steps", "steps"),
            ("runs", "runs"),
            ("real_s", "real s"),
            ("fleet_s", "fleet-clock s"),
            ("error_pct", "error %"),
            ("error_pct_range", "error % (runs)"),
            ("fleet_s_sized", "fleet s (sized link)"),
            ("error_pct_sized", "error % (sized link)"),
            ("overhead_ms_per_step", "real − fleet ms/step"),
            ("error_pct_calibrated", "calibrated error %"),
            ("job_cpu_share", "job's core share"),
        ],
    )
    shaped = [r for r in summary if r["link"] != "unshaped"]
    sized = [abs(r["error_pct_sized"]) for r in shaped]
    nominal = [abs(r["error_pct"]) for r in shaped]
    verdict = (
        f"shaped links, the clock's link measured as a step uses it (every worker moving its step's bytes "
        f"at once): largest |error| {max(sized):.1f}% (target ≤ 15%): "
        f"{'met' if max(sized) <= 15 else 'missed'}; "
        f"{sum(e <= 15 for e in sized)} of {len(shaped)} cells within 15%; with the tbf rate as the link: "
        f"largest |error| {max(nominal):.1f}%, {sum(e <= 15 for e in nominal)} within 15%"
    )
    calibrated = [r["error_pct_calibrated"] for r in shaped if "error_pct_calibrated" in r]
    if calibrated:
        verdict += (
            f"; with the unshaped run's per-step overhead added: largest |error| {max(abs(e) for e in calibrated):.1f}%"
        )
    print(verdict)
    return verdict


def criteo_shaped(seed: int) -> str:
    """Criteo's shape at a bench's size (bench/quality.py's criteo-shaped: 39 values a row over
    100,000 hashed features, heavy popularity skew), in 6,250-row minibatches; prepared once."""
    from ebb.data.prepare import prepare_dataset
    from ebb.data.synth import synth_logistic
    from ebb.stores.local import FolderObjectStore

    root = Path(__file__).resolve().parent / "data" / f"fleet-criteo-s{seed}"
    prepared = root / "prepared"
    if not (prepared / "manifest.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        synth_logistic(root / "data.svm", rows=200_000, features=100_000, nnz=39, zipf=1.0, seed=seed)
        prepare_dataset(
            "libsvm",
            root / "data.svm",
            FolderObjectStore(prepared),
            batch_size=6250,
            test_fraction=0.1,
            val_fraction=0.0,
            seed=seed,
        )
    return str(prepared)


def epochs_for(data_dir: str, steps: int, workers: int) -> float:
    """``stop.max_epochs`` that ends a run after exactly ``steps`` steps of ``workers`` workers."""
    from ebb.ports.manifest import load_manifest
    from ebb.stores.local import FolderObjectStore

    return steps * workers / len(load_manifest(FolderObjectStore(data_dir)).train.parts)


def release_probe(args, redis_url: str, link: float | None, rtt_ms: float) -> dict:
    """The barrier's release on this network, as the engine meets it: a job of empty steps
    (ISP with a threshold nothing passes, 20-rating minibatches) whose workers sit behind
    the shaped links; the median from the last announcement to the first worker's go, less
    the two round trips (announce, go) the clock already charges, is ``clock.barrier_ms``."""
    from sync import barrier_dataset

    from ebb.local.runner import run_local
    from ebb.spec import load_spec

    data_dir, parts = barrier_dataset(args.seed)
    name = f"fleet-proof-release-{'unshaped' if link is None else f'{link:g}'}"
    shutil.rmtree(RUNS / name, ignore_errors=True)
    spec = load_spec(
        overrides={
            "name": name,
            "model": "pmf",
            "data": data_dir,
            "workers": args.workers,
            "hyper.rank": 2,
            "sync.mode": "isp",
            "sync.significance": 1e12,
            "scaling.policy": "none",
            "stop.eval_every": 0,
            "stop.max_epochs": 300 * args.workers / parts,
            "redis_urls": [redis_url],
            "out": str(RUNS / name),
        }
    )
    report, _ = run_local(spec, child_setup=lambda w: worker_setup(w, priority=not args.no_priority))
    first = report["sync_overhead_ms"]["first_worker_median"]
    return {
        "release_first_worker_ms": first,
        "release_all_workers_ms": report["sync_overhead_ms"]["median"],
        "barrier_ms": max(0.0, first - 2 * rtt_ms),
    }


def run_one(args, data_dir: str, redis_url: str, redis_pid: int, link: float, probe_row: dict, sync: str) -> dict:
    """One job on the shaped network, on the fleet clock with the shaped link's figures."""
    from ebb.engine.fleet_clock import Links
    from ebb.local.runner import run_local
    from ebb.spec import load_spec

    # Unshaped (the veth at the host's speed): the clock gets a link too fast to matter.
    link_payload = UNSHAPED_MB_S if link is None else link * PAYLOAD_SHARE
    rtt_ms = probe_row["rtt_ms_median"]
    node = args.node_mb_s * PAYLOAD_SHARE if args.node_mb_s else NODE_UNSHAPED_MB_S
    name = f"fleet-proof-{args.model}-{sync}-{'unshaped' if link is None else f'{link:g}'}"
    spec = load_spec(
        overrides={
            "name": name,
            "model": args.model,
            "data": data_dir,
            "workers": args.workers,
            **({"hyper.rank": 20} if args.model == "pmf" else {}),
            "seed": args.seed,
            "scaling.policy": "none",
            "stop.max_epochs": epochs_for(data_dir, args.steps, args.workers),
            "stop.eval_every": 0,
            "stop.max_seconds": 3600.0,
            "redis_urls": [redis_url],
            "out": str(RUNS / name),
            **SYNCS[sync],
            "clock.kind": "fleet",
            "clock.link_mb_s": link_payload,
            "clock.rtt_ms": rtt_ms,
            "clock.node_mb_s": node,
            "clock.cold_start_s": 0.0,
            "clock.barrier_ms": probe_row["barrier_ms"],
        }
    )
    print(
        f"-- {sync}, link {link or 'unshaped'} MB/s: clock link {link_payload:.1f} MB/s, rtt {rtt_ms:.3f} ms, "
        f"barrier {probe_row['barrier_ms']:.2f} ms",
        flush=True,
    )
    shutil.rmtree(RUNS / name, ignore_errors=True)  # a benchmark's scratch output: each run starts clean
    recorder = Recorder()
    idle0, total0 = cpu_times()
    sup0, redis0, t0 = process_cpu(), process_cpu(redis_pid), time.perf_counter()
    report, _ = run_local(
        spec, measure_of=recorder, child_setup=lambda w: worker_setup(w, priority=not args.no_priority)
    )
    sup_cpu, redis_cpu = process_cpu() - sup0, process_cpu(redis_pid) - redis0
    whole = time.perf_counter() - t0
    idle1, total1 = cpu_times()
    hist = report["history"]
    real = hist[-1]["host_time"] - hist[0]["host_time"]
    fleet = hist[-1]["time"] - hist[0]["time"]
    slack = spec.sync.slack if sync == "ssp" else 0
    measured_link = (probe_row["up_mb_s"] + probe_row["down_mb_s"]) / 2
    sizes = transfer_sizes(recorder.reports)
    transfer = statistics.mean(sizes) if sizes else 0.0
    link_sized = sized_link(probe_row, sizes)
    per_step = len(hist) - 1
    totals = report["totals"]
    return {
        "link_mb_s": link,
        "sync": sync,
        "steps": report["steps"],
        "status": report["status"],
        "real_s": real,
        "fleet_s": fleet,
        "error_pct": 100 * (fleet - real) / real,
        "overhead_ms_per_step": 1e3 * (real - fleet) / (len(hist) - 1),
        "whole_run_real_s": report["host_seconds"],
        "whole_run_fleet_s": report["wall_seconds"],
        "clock_link_mb_s": link_payload,
        "clock_rtt_ms": rtt_ms,
        "clock_node_mb_s": node,
        "cpu_idle_pct": 100 * (idle1 - idle0) / (total1 - total0),
        "loadavg_1m": os.getloadavg()[0],
        "cpu_ms_critical_per_step": 1e3 * totals["cpu_critical_seconds"] / report["steps"],
        "mb_per_worker_step": (totals["bytes_sent"] + totals["bytes_received"])
        / 1e6
        / (report["steps"] * args.workers),
        "ms_per_step_real": 1e3 * real / per_step,
        "ms_per_step_fleet": 1e3 * fleet / per_step,
        # The same reports with the probe's measured throughput as the link (it holds the
        # client's CPU for those bytes, which cpu_seconds counts too): the other way to set it.
        "fleet_s_measured_link": replay(
            recorder.reports, Links(measured_link, rtt_ms, node, 0.0, probe_row["barrier_ms"]), slack
        ),
        # The link as a step uses it: the concurrent probe's rate for transfers of the run's
        # sizes, time-weighted (sized_link). Unshaped too: there the bound is the one redis-server serving every
        # worker at once (a cache node's CPU, which a fleet's node has as well).
        "transfer_kb": transfer / 1e3,
        "clock_link_sized_mb_s": link_sized,
        "fleet_s_sized_link": replay(
            recorder.reports, Links(link_sized, rtt_ms, node, 0.0, probe_row["barrier_ms"]), slack
        ),
        # Where a worker's real step went (median ms per phase over its reports): the wall
        # time the fleet clock is to explain.
        "phase_ms_median": phase_ms(recorder.reports, statistics.median),
        "phase_ms_mean": phase_ms(recorder.reports),
        # What this job asked of the machine's 2 cores during the run: workers (their
        # reported CPU), the supervisor and redis-server. Near 1, the job queues on itself.
        "supervisor_cpu_s": sup_cpu,
        "redis_cpu_s": redis_cpu,
        "job_cpu_share": (totals["cpu_seconds"] + sup_cpu + redis_cpu) / ((os.cpu_count() or 1) * whole),
        "io_cpu_ms_per_mb": io_cpu_ms_per_mb(recorder.reports),
        # The same reports with the I/O CPU added to the wire time instead of overlapping it
        # (the clock before it measured io_cpu_seconds): what the overlap changes.
        "fleet_s_no_overlap": replay(
            [{**r, "io_cpu_seconds": 0.0} for r in recorder.reports],
            Links(link_payload, rtt_ms, node, 0.0, probe_row["barrier_ms"]),
            slack,
        ),
        "clock_barrier_ms": probe_row["barrier_ms"],
        "final_train_rmse": report["final_loss"],
        "unshaped": link is None,
        # The engine's own barrier latency: last announcement -> the first worker's go (median).
        "barrier_first_worker_ms": (report.get("sync_overhead_ms") or {}).get("first_worker_median"),
        "test_metrics": report["test_metrics"],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cleanup", action="store_true", help="remove leftover namespaces/veths of a killed run, exit")
    ap.add_argument("--summarise", metavar="JSON", help="re-summarise an earlier run's JSON (rewrites its summary)")
    ap.add_argument("--probe", action="store_true", help="only build the network and measure each link rate")
    ap.add_argument("--links", default="25,75,200", help="per-worker link rates, MB/s (comma-separated)")
    ap.add_argument(
        "--unshaped",
        action="store_true",
        help="also run on unshaped links: what is left of the error is the host's, not the network's",
    )
    ap.add_argument(
        "--node-mb-s",
        type=float,
        default=None,
        help="shape the Redis node's link too, MB/s (default: unshaped; its measured rate goes into the clock)",
    )
    ap.add_argument(
        "--burst-ms",
        type=float,
        default=BURST_MS,
        help=f"tbf bucket size as milliseconds of the rate (default {BURST_MS:g})",
    )
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2: as many as cores)")
    ap.add_argument("--syncs", default="bsp,isp,ssp", help="sync models to run (bsp, isp, ssp)")
    ap.add_argument("--shape", default="quick", help="bench/sync.py's PMF data shape (default quick: 1M ratings)")
    ap.add_argument(
        "--model",
        choices=["pmf", "sparse_lr"],
        default="pmf",
        help="pmf (bench/sync.py's planted ratings) | sparse_lr (a Criteo-shaped generated set)",
    )
    ap.add_argument("--steps", type=int, default=288, help="fixed length of every run, steps (default 288)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="run the whole matrix this many times (default 2)")
    ap.add_argument("--json", help="output JSON (default bench/results/fleet_proof/<model>[-node<MB/s>|-probe].json)")
    ap.add_argument("--no-priority", action="store_true", help="do not renice the benchmark's processes")
    args = ap.parse_args(argv)

    if args.summarise:  # no network, no root: the tables of an earlier run, with today's summary
        payload = json.loads(Path(args.summarise).read_text())
        payload["summary"] = summarise(payload["rows"])
        payload["verdict"] = print_summary(payload["summary"])
        Path(args.summarise).write_text(json.dumps(payload, indent=2))
        return
    if os.geteuid() != 0:
        raise SystemExit("fleet_proof.py needs root (network namespaces, tc)")
    if args.cleanup:
        removed = cleanup()
        print("\n".join(removed) if removed else "nothing to remove")
        return
    data_dir = None
    if not args.probe:
        from sync import dataset

        data_dir = dataset(args.shape, args.seed)[0] if args.model == "pmf" else criteo_shaped(args.seed)
    if not args.no_priority:
        raise_priority()
    # A SIGTERM unwinds like Ctrl-C, so the finally below removes the network.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    net = ShapedNet(args.workers, args.burst_ms)
    redis_srv = RedisInNetns()
    try:
        net.up()
        redis_srv.start()
        if not args.no_priority:
            raise_priority(redis_srv.proc.pid)  # its own session: its own autogroup
        probes = []
        for link in [None, *parse_rates(args.links)]:
            net.shape(link, args.node_mb_s)
            row = {
                "link_mb_s": link,
                "burst_bytes": link and burst_bytes(link, args.burst_ms),
                "gso_max_bytes": net.gso_bytes,
                **probe(redis_srv.url),
                "sized_mb_s": sized_probe(redis_srv.url, args.workers, refill_s=2e-3 * args.burst_ms),
            }
            if not args.probe:
                row.update(release_probe(args, redis_srv.url, link, row["rtt_ms_median"]))
            probes.append(row)
        print_table(
            probes,
            [
                ("link_mb_s", "tbf MB/s"),
                ("up_mb_s", "SET MB/s"),
                ("down_mb_s", "GET MB/s"),
                ("rtt_ms_median", "PING ms"),
                ("rtt_ms_p90", "PING p90 ms"),
                ("release_first_worker_ms", "release ms (first go)"),
                ("barrier_ms", "clock barrier ms"),
            ],
        )
        if args.probe:
            write_json(
                result_path("fleet_proof", f"{args.model}-probe"),
                {"burst_ms": args.burst_ms, "links": probes},
                args.json,
            )
            return
        rows = []
        for repeat in range(args.repeats):  # interleaved: a drift in the machine's load hits every cell alike
            for probe_row in probes[1:] + (probes[:1] if args.unshaped else []):
                link = probe_row["link_mb_s"]
                net.shape(link, args.node_mb_s)
                for sync in args.syncs.split(","):
                    rows.append(
                        {
                            "repeat": repeat,
                            **run_one(args, data_dir, redis_srv.url, redis_srv.proc.pid, link, probe_row, sync),
                        }
                    )
                    r = rows[-1]
                    print(
                        f"   {r['steps']} steps: real {r['real_s']:.2f} s, fleet clock {r['fleet_s']:.2f} s "
                        f"({r['error_pct']:+.1f}%), CPU idle {r['cpu_idle_pct']:.0f}%, the job's share of the "
                        f"cores {r['job_cpu_share']:.2f}",
                        flush=True,
                    )
    finally:
        redis_srv.stop()
        net.down()
    print()
    print_table(
        rows,
        [
            ("repeat", "#"),
            ("link_mb_s", "link MB/s"),
            ("sync", "sync"),
            ("steps", "steps"),
            ("real_s", "real s"),
            ("fleet_s", "fleet-clock s"),
            ("error_pct", "error %"),
            ("fleet_s_no_overlap", "no-overlap s"),
            ("fleet_s_sized_link", "fleet s (sized link)"),
            ("fleet_s_measured_link", "fleet s (probe link)"),
            ("ms_per_step_real", "real ms/step"),
            ("cpu_ms_critical_per_step", "busiest CPU ms/step"),
            ("mb_per_worker_step", "MB/worker/step"),
            ("cpu_idle_pct", "CPU idle %"),
            ("job_cpu_share", "job's core share"),
        ],
    )
    summary = summarise(rows)
    print()
    verdict = print_summary(summary)
    worst = max(abs(r["error_pct_sized"]) for r in summary if r["link"] != "unshaped")
    node = f"-node{args.node_mb_s:g}" if args.node_mb_s else ""
    write_json(
        result_path("fleet_proof", f"{args.model}{node}"),
        {
            "method": {
                "model": args.model,
                "shape": args.shape if args.model == "pmf" else "criteo-shaped",
                "workers": args.workers,
                "steps": args.steps,
                "burst_ms": args.burst_ms,
                "node_mb_s": args.node_mb_s,
                "payload_share": PAYLOAD_SHARE,
                "priority": not args.no_priority,
                "real": "host seconds from the first closed step to the last (history[].host_time)",
                "fleet": "fleet-clock seconds over the same steps of the same run (history[].time)",
            },
            "probes": probes,
            "summary": summary,
            "rows": rows,
            "verdict": verdict,
            "max_abs_error_pct": worst,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
