"""``ebb tune`` here: trials as ordinary jobs under ``OUT/trials/tNNN`` (own checkpoints,
report, model), run concurrently within a CPU budget, each job in a process of its own
(``ebb.tune.trial``) with its own worker processes, all over one shared redis-server.

``OUT/tune_state.json`` holds the search (``Search.state_dict``), the base job and the tune
settings, rewritten after every start and end of a job; ``ebb tune --resume OUT`` after any
kill carries on from it: finished rungs are never trained again, an interrupted job resumes
from its trial's last complete round.

*Trial packs* (the default; ``--no-packs`` for one process per job): a warm fleet (one by
default, ``--fleets N`` within the CPU budget) is one process that trains the jobs the
search hands it one after another, the ASHA decision taken between them, as one execution
of warm functions would on AWS. It loads the training split once (``trial.warm_fleet``)
and pays one cold start; its jobs are priced for what each adds (``cost.meter.packed``),
and a trial it prunes writes its report alone. A fleet the search has no job for ends its
pack (an idle fleet would be billed); the next job starts a new one. What a pack pays once
(``cost.meter.pack_cost``: its start, its execution, and its fleet's waits while the search
decides the next job) is shared by the trials it trained, by their fleet seconds in it:
each trial's report says its share (``cost.pack_usd``), so ``tune.json``'s ``total_usd``,
the trials' sum, is what the packs cost.

When the search is over: every trial left between rungs gets its report (status
``pruned``), ``OUT/tune.json`` holds the leaderboard, ``OUT/best/`` the best trial's model,
report and plot, ``OUT/tune.png`` each trial's validation against epochs.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ebb.spec import JobSpec, load_spec
from ebb.tune.scheduler import Job, Outcome, Search, Trial
from ebb.tune.space import TuneSpec, start_point
from ebb.tune.trial import TRIAL_SPEC, close, last_rung_passes, outcome

STATE = "tune_state.json"
RESULT = "tune.json"
POLL_S = 0.2


class TuneError(ValueError):
    """What the user can fix, in one line."""


class Base:
    """The job every trial is: a job file's text (its ``tune:`` section removed) and flags,
    with the trial's sampled fields on top."""

    def __init__(self, job_yaml: str | None, overrides: dict[str, Any], assignments: list[str]):
        self.job_yaml, self.overrides, self.assignments = job_yaml, overrides, assignments

    def spec(self, params: dict[str, Any] | None = None, name: str | None = None, out: str | None = None) -> JobSpec:
        import tempfile

        fields = {**self.overrides, **(params or {})}
        if name is not None:
            fields.update({"name": name, "out": out})
        if self.job_yaml is None:
            return load_spec(None, fields, self.assignments)
        with tempfile.NamedTemporaryFile("w", suffix="-job.yaml") as f:
            f.write(self.job_yaml)
            f.flush()
            return load_spec(f.name, fields, self.assignments)

    def state(self) -> dict[str, Any]:
        return {"job_yaml": self.job_yaml, "overrides": self.overrides, "assignments": self.assignments}


def unit_steps(spec: JobSpec) -> int:
    """Steps in an epoch at one worker's pace: the rungs' unit (and the scorings' interval)."""
    from ebb.engine.cadence import one_worker_epoch
    from ebb.ports.manifest import load_manifest
    from ebb.stores import open_object_store

    manifest = load_manifest(open_object_store(spec.data), spec.data)
    return one_worker_epoch(spec, len(manifest.train.parts))


class LocalTune:
    """One search, run here. ``say`` gets a line per finished job."""

    def __init__(
        self,
        out: Path,
        tspec: TuneSpec,
        base: Base,
        say: Callable[[str], None] = print,
        packs: bool = True,
        fleets: int = 1,
    ):
        self.out, self.tspec, self.base, self.say, self.use_packs = out, tspec, base, say, packs
        self.fleets = fleets  # warm fleets at once (packs): each pays its own start
        self.search: Search
        self.wall_before = 0.0
        self._units: dict[int, int] = {}
        self.packs: list[dict[str, Any]] = []  # every pack: what it paid once, its jobs, each trial's share

    # -- state ---------------------------------------------------------------------
    @classmethod
    def resume(cls, out: Path, say: Callable[[str], None] = print) -> LocalTune:
        try:
            saved = json.loads((out / STATE).read_text())
        except (OSError, ValueError):
            raise TuneError(f"--resume: {out} holds no search to resume (no readable {STATE})") from None
        b = saved["base"]
        run = cls(
            out,
            TuneSpec.model_validate(saved["tune"]),
            Base(b["job_yaml"], b["overrides"], b["assignments"]),
            say,
            packs=saved.get("packs_on", False),
            fleets=saved.get("fleets", 1),
        )
        run.search = Search(run.tspec, saved["search"])
        run.wall_before = saved.get("wall_seconds", 0.0)
        run.packs = saved.get("packs", [])
        for pack in run.packs:  # killed mid-pack: it is over, paid for what it ran
            pack["open"] = False
        return run

    def start(self) -> None:
        if (self.out / STATE).exists() or (self.out / RESULT).exists():
            raise TuneError(
                f"{self.out} holds a search already: continue it with --resume {self.out}, or choose another --out"
            )
        from ebb.engine.preflight import PreflightError, preflight
        from ebb.stores import open_object_store

        base = self.base.spec()  # the base job must be valid, and its data sound, before anything runs
        try:
            preflight(base, open_object_store(base.data))
        except (PreflightError, OSError, ValueError) as exc:
            raise TuneError(str(exc)) from None
        from ebb.ports.manifest import load_manifest

        manifest = load_manifest(open_object_store(base.data), base.data)
        self.out.mkdir(parents=True, exist_ok=True)
        self.search = Search(self.tspec, start=start_point(self.tspec, base, manifest))

    def _save(self, wall: float) -> None:
        state = {
            "tune": self.tspec.model_dump(mode="json"),
            "base": self.base.state(),
            "search": self.search.state_dict(),
            "wall_seconds": wall,
            "packs_on": self.use_packs,
            "fleets": self.fleets,
            "packs": self.packs,
        }
        tmp = self.out / (STATE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.out / STATE)  # a kill never leaves half a state

    # -- trials --------------------------------------------------------------------
    def trial_dir(self, trial: int) -> Path:
        return self.out / "trials" / f"t{trial:03d}"

    def trial_spec(self, t: Trial) -> JobSpec:
        """Trial ``t``'s job: written once, read by every job of the trial."""
        path = self.trial_dir(t.id) / TRIAL_SPEC
        if path.exists():
            return JobSpec.model_validate_json(path.read_text())
        base = self.base.spec()
        spec = self.base.spec(t.params, name=f"{base.name[:56]}-t{t.id:03d}", out=str(self.trial_dir(t.id)))
        top_passes = last_rung_passes(self.tspec.rungs()[-1], unit_steps(spec), spec, _num_parts(spec))
        spec = spec.model_copy(
            update={"stop": spec.stop.model_copy(update={"max_epochs": top_passes}), "redis_urls": []}
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec.model_dump_json(indent=2))
        return spec

    def units(self, t: Trial) -> int:
        if t.id not in self._units:
            self._units[t.id] = unit_steps(self.trial_spec(t))
        return self._units[t.id]

    def launch(self, job: Job, redis_url: str) -> mp.Process:
        """Start ``job`` in a forked process (``ebb.tune.trial``): the imports are done once, here."""
        t = self.search.trials[job.trial]
        self.trial_spec(t)
        folder = self.trial_dir(t.id)
        to_steps = job.to_epochs * self.units(t)
        proc = mp.get_context("fork").Process(
            target=_job_process,
            args=(str(folder), to_steps, redis_url, job.budget_usd),
            name=f"ebb-trial-{t.id}",
        )
        proc.start()
        return proc

    def finish_job(self, job: Job, code: int, pack: dict[str, Any] | None = None) -> None:
        t = self.search.trials[job.trial]
        spec = self.trial_spec(t)
        got = outcome(spec, self.units(t))
        if pack is not None:  # the job's fleet seconds in its pack (its share of what the pack paid)
            seconds = max(0.0, got["wall_seconds"] - t.wall_seconds)
            pack["jobs"].append({"trial": t.id, "rung": job.rung, "seconds": round(seconds, 4)})
            self._reshare(pack)
        got["cost_usd"] += self.pack_usd(t.id)
        error = None
        if code != 0:
            got["status"] = "failed"
            try:
                error = json.loads((self.trial_dir(t.id) / "report.json").read_text()).get("error")
            except (OSError, ValueError):
                error = f"the trial's process exited with code {code} (see {self.trial_dir(t.id) / 'log.txt'})"
        self.search.job_done(job, Outcome(**got, error=error))
        score = f"{t.scores[job.rung]:.4f}" if job.rung in t.scores else "-"
        self.say(
            f"trial {t.id:3d} rung {job.rung} ({job.to_epochs:g} ep): {got['status']:<13} val {score}  "
            f"{_params_text(t.params)}  ${t.cost_usd:.4f}"
        )

    # -- packs ---------------------------------------------------------------------
    def pack_usd(self, trial: int) -> float:
        """Trial ``trial``'s share of what the packs paid once."""
        return pack_usd(self.packs, trial)

    def _open_pack(self, slot: int, first: Job, redis_url: str) -> _Pack:
        """A warm fleet for ``slot``: its process, up and with the data loaded; what it paid
        to get there is charged to ``first``'s trial until its jobs share it."""
        spec = self.base.spec()
        record = {"pack": len(self.packs), "slot": slot, "workers": spec.workers, "jobs": [], "open": True}
        (self.out / "packs").mkdir(parents=True, exist_ok=True)
        pack = _Pack(record, spec, self.out / "packs" / f"p{record['pack']:03d}.log", redis_url)
        warm = pack.warm  # blocks until loaded (about what one job's first epoch reads)
        cold = spec.clock.cold_start_s if spec.clock.kind == "fleet" else 0.0
        record.update(
            {
                "warm": warm,
                "cold_start_s": cold,
                "start_seconds": round(cold + (warm["cpu_seconds"] if warm else 0.0), 4),
                "loads": spec.workers * warm["gets"] if warm else 0,  # every function loads it
                "decisions": 0,  # the search's, between its jobs: its fleet waits (billed)
                "decide_seconds": 0.0,
                "first_trial": first.trial,
            }
        )
        price_pack(record, spec)
        record["shares"] = {str(first.trial): record["usd"]}
        self.search.trials[first.trial].cost_usd += record["usd"]
        self.packs.append(record)
        return pack

    def _close_pack(self, pack: _Pack) -> None:
        """The pack's last job is done: its fleet stops; the fixed cost is shared out again,
        now that all its jobs (and how many waves of invocations they took) are known."""
        pack.close()
        record = pack.record
        record["open"] = False
        trained = sum(j["seconds"] for j in record["jobs"])
        record["waves"] = 1 + int((record["seconds"] + trained) // self.base.spec().round_seconds)
        price_pack(record, self.base.spec())
        self._reshare(record)

    def _decided(self, pack: _Pack) -> None:
        """The search has decided what ``pack`` does next (a job, or to stop): the time since
        its last job ended, which its fleet spent waiting, is the pack's. On the fleet clock
        that is the CPU the search spent deciding (reading the trial's checkpoints, Optuna,
        its state), as a worker's step is its CPU; on the host clock, the host's time."""
        if pack.freed_at is None:
            return
        record = pack.record
        fleet = self.base.spec().clock.kind == "fleet"
        spent = time.process_time() - pack.freed_at[1] if fleet else time.monotonic() - pack.freed_at[0]
        record["decisions"] += 1
        record["decide_seconds"] = round(record["decide_seconds"] + spent, 4)
        pack.freed_at = None
        price_pack(record, self.base.spec())
        self._reshare(record)

    def _reshare(self, record: dict[str, Any]) -> None:
        """Share ``record``'s fixed cost out again (``_share``), the trials' costs moved with it."""
        reshare(record, self.search.trials)

    # -- the loop ------------------------------------------------------------------
    def _next_job(self, pending: list[Job]) -> Job | None:
        """The next job: an interrupted one first (a resumed search), else the search's."""
        if pending:
            job = pending.pop(0)
            self.search.start(job)
            return job
        return self.search.next_job()

    def run(self) -> dict[str, Any]:
        if self.use_packs:
            return self.run_packs()
        from ebb.local.redis_server import RedisServer

        started = time.monotonic()
        workers = self.base.spec().workers
        budget = self.tspec.cpu_budget()
        pending = self.search.interrupted_jobs()
        running: dict[int, tuple[mp.Process, Job]] = {}
        procs: list[mp.Process] = []
        try:
            with RedisServer() as server:
                while True:
                    while not running or (len(running) + 1) * workers <= budget:
                        job = self._next_job(pending)
                        if job is None:
                            break
                        proc = self.launch(job, server.url)
                        procs.append(proc)
                        running[job.trial] = (proc, job)
                        self._save(self.wall_before + time.monotonic() - started)
                    if not running:
                        break
                    time.sleep(POLL_S)
                    for trial, (proc, job) in list(running.items()):
                        code = proc.exitcode
                        if code is not None:
                            proc.join()
                            del running[trial]
                            self.finish_job(job, code)
                            self._save(self.wall_before + time.monotonic() - started)
        finally:
            for proc in procs:  # Ctrl-C or a crash: no trial outlives the search
                if proc.exitcode is None:
                    proc.terminate()
            for proc in procs:
                proc.join(10)
                if proc.exitcode is None:
                    proc.kill()
                    proc.join()
        wall = self.wall_before + time.monotonic() - started
        self._save(wall)
        return self.conclude(wall)

    def run_packs(self) -> dict[str, Any]:
        """The search in trial packs: a warm fleet per slot of the CPU budget, each training
        the search's next job as soon as its last is done."""
        # What a decision reads checkpoints with, imported before the first is timed (a
        # supervisor function has it loaded: its cold start).
        import ebb.local.runner  # noqa: F401
        from ebb.local.redis_server import RedisServer

        started = time.monotonic()
        workers = self.base.spec().workers
        slots: list[_Pack | None] = [None] * max(1, min(self.fleets, self.tspec.cpu_budget() // workers))
        pending = self.search.interrupted_jobs()
        try:
            with RedisServer() as server:
                while True:
                    for i, pack in enumerate(slots):
                        if pack is not None and pack.job is not None:
                            continue
                        if pack is not None and not pack.alive():  # (its job failed with it)
                            self._close_pack(pack)
                            pack = slots[i] = None
                        job = self._next_job(pending)
                        if job is None:
                            if pack is not None:  # nothing for it now: an idle fleet is billed, so it stops
                                self._decided(pack)
                                self._close_pack(pack)
                                slots[i] = None
                                self._save(self.wall_before + time.monotonic() - started)
                            continue
                        if pack is None:
                            pack = slots[i] = self._open_pack(i, job, server.url)
                        self.trial_spec(self.search.trials[job.trial])
                        budget = job.budget_usd
                        if budget is not None:  # the engine meters the job alone: less its trial's pack share
                            budget -= self.pack_usd(job.trial)
                        to_steps = job.to_epochs * self.units(self.search.trials[job.trial])
                        self._decided(pack)
                        pack.send(job, str(self.trial_dir(job.trial)), to_steps, budget)
                        self._save(self.wall_before + time.monotonic() - started)
                    if not any(p is not None and p.job is not None for p in slots):
                        break
                    time.sleep(POLL_S)
                    for pack in slots:
                        if pack is None or pack.job is None:
                            continue
                        code = pack.done()
                        if code is not None:
                            job, pack.job = pack.job, None
                            pack.freed_at = (time.monotonic(), time.process_time())
                            self.finish_job(job, code, pack.record)
                            self._save(self.wall_before + time.monotonic() - started)
        finally:
            for pack in slots:  # Ctrl-C or a crash: no fleet outlives the search
                if pack is not None:
                    pack.kill()
        wall = self.wall_before + time.monotonic() - started
        self._save(wall)
        return self.conclude(wall)

    # -- the results ---------------------------------------------------------------
    def conclude(self, wall: float) -> dict[str, Any]:
        """Reports for the trials the search stopped between rungs, the leaderboard in tune.json,
        the best trial in OUT/best, the plot."""
        from contextlib import nullcontext

        from ebb.cost.meter import packed

        reports = {}
        for t in self.search.trials:
            report_path = self.trial_dir(t.id) / "report.json"
            if not report_path.exists() and t.rung >= 0 and t.status == "paused":
                with packed() if self.use_packs else nullcontext():
                    close(self.trial_spec(t), "pruned", outputs=not self.use_packs)
            if report_path.exists() and self.packs:
                _add_pack_share(report_path, self.pack_usd(t.id))
            reports[t.id] = json.loads(report_path.read_text()) if report_path.exists() else {}
        result = tune_result(self.search, wall, reports, lambda t: str(self.trial_dir(t)))
        pack_totals(result, self.packs, reports)
        best = self.search.best()
        if best is not None:
            dest = self.out / "best"
            dest.mkdir(exist_ok=True)
            for name in BEST_FILES:
                src = self.trial_dir(best.id) / name
                if src.exists():
                    shutil.copyfile(src, dest / name)
        (self.out / RESULT).write_text(json.dumps(result, indent=2))
        _plot(result["trials"], self.out / "tune.png", self.base.spec().model)
        return result


# What OUT/best holds of the best trial (tunes/<id>/best/ on a stack).
BEST_FILES = ("report.json", "model.npz", "loss.png", TRIAL_SPEC)


def tune_result(
    search: Search, wall: float, reports: dict[int, dict[str, Any]], folder: Callable[[int], str]
) -> dict[str, Any]:
    """tune.json: the leaderboard (a row per trial, best first; ``reports``: each trial's
    report, or {} where it has none), the best trial, the totals and the launches.
    ``folder(trial)`` says where a trial's job lives (a local folder, or its job's outputs)."""
    rows = []
    for t in search.leaderboard():
        report = reports.get(t.id, {})
        rows.append(
            {
                "trial": t.id,
                "params": t.params,
                "best_val": t.best if t.scores else None,
                "scores": {str(k): v for k, v in sorted(t.scores.items())},  # by rung
                "rung": t.rung,
                "epochs": round(t.epochs, 4),
                "status": report.get("status", t.status),
                "cost_usd": report.get("cost", {}).get("total_usd", t.cost_usd),
                "wall_seconds": t.wall_seconds,
                "test_metrics": report.get("test_metrics"),
                "curve": t.curve,
                "folder": folder(t.id),
                "error": t.error,
            }
        )
    best = search.best()
    return {
        "best": {"trial": best.id, "params": best.params, "best_val": best.best, "folder": folder(best.id)}
        if best
        else None,
        "trials": rows,
        "total_usd": round(sum(r["cost_usd"] for r in rows), 6),
        "wall_seconds": round(wall, 3),
        "fleet_wall_seconds": round(_fleet_wall(search), 3),
        "job_seconds": round(sum(t.wall_seconds for t in search.trials), 3),
        "budget_usd": search.spec.budget_usd,
        "rungs": search.rungs,
        "launches": search.launches,
        "tune": search.spec.model_dump(mode="json"),
    }


def pack_totals(result: dict[str, Any], packs: list[dict[str, Any]], reports: dict[int, dict[str, Any]]) -> None:
    """tune.json's pack fields (a local search's or a stack's): ``packs`` (without ``open``),
    ``packs_usd``, ``fleet_wall_seconds`` over the packs, and ``cost_by_component``."""
    if packs:
        result["packs"] = [{k: v for k, v in p.items() if k not in ("open", "job")} for p in packs]
        result["packs_usd"] = round(sum(p["usd"] for p in packs), 6)
        # The fleets run side by side, each its packs one after another: the busiest
        # one's time (its start-ups and jobs; the waits between are left out).
        busy: dict[int, float] = {}
        for p in packs:
            busy[p["slot"]] = busy.get(p["slot"], 0.0) + p["seconds"] + sum(j["seconds"] for j in p["jobs"])
        result["fleet_wall_seconds"] = round(max(busy.values()), 3)
    # Where the money went: the trials' jobs and the packs' fixed costs, by component.
    parts = [r.get("cost", {}).get("by_component", {}) for r in reports.values()]
    parts += [p["by_component"] for p in packs]
    result["cost_by_component"] = {
        k: round(sum(c.get(k, 0.0) for c in parts), 8) for k in sorted({k for c in parts for k in c})
    }


def pack_usd(packs: list[dict[str, Any]], trial: int) -> float:
    """Trial ``trial``'s share of what ``packs`` paid once."""
    return sum(p["shares"].get(str(trial), 0.0) for p in packs)


def reshare(record: dict[str, Any], trials: list[Trial]) -> None:
    """Share ``record``'s fixed cost out again (``_share``), the trials' costs moved with it."""
    before = dict(record["shares"])
    _share(record)
    for key in set(before) | set(record["shares"]):
        trials[int(key)].cost_usd += record["shares"].get(key, 0.0) - before.get(key, 0.0)


def _job_process(folder: str, to_steps: int, redis_url: str, budget_usd: float | None) -> None:
    from ebb.local.redis_server import die_with_parent
    from ebb.tune.trial import run_job

    die_with_parent()  # a search killed outright takes its trials with it; --resume runs them again
    log = os.open(os.path.join(folder, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.exit(run_job(folder, to_steps, redis_url, budget_usd))


class _Pack:
    """A trial pack's process (``_pack_process``), seen from the search: the job it trains."""

    def __init__(self, record: dict[str, Any], spec: JobSpec, log: Path, redis_url: str):
        self.record, self.redis_url = record, redis_url
        self.job: Job | None = None
        # When its last job ended (host time, the search's CPU time), until the search decides.
        self.freed_at: tuple[float, float] | None = None
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_pack_process, args=(child, spec.model_dump_json(), str(log)), name=f"ebb-pack-{record['pack']}"
        )
        self.proc.start()
        child.close()
        try:
            self.warm: dict[str, float] | None = self.conn.recv()
        except EOFError:
            self.kill()
            raise TuneError(f"a trial pack's process ended while loading the data (see {log})") from None

    def send(self, job: Job, folder: str, to_steps: int, budget_usd: float | None) -> None:
        self.job = job
        self.conn.send((folder, to_steps, self.redis_url, budget_usd))

    def done(self) -> int | None:
        """The job's exit code once it is over (1 if the pack's process died under it)."""
        try:
            if self.conn.poll():
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        if self.proc.exitcode is not None:
            return self.proc.exitcode or 1
        return None

    def alive(self) -> bool:
        return self.proc.exitcode is None

    def close(self) -> None:
        if self.alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(30)
        self.kill()

    def kill(self) -> None:
        if self.proc.exitcode is None:
            self.proc.terminate()
            self.proc.join(10)
            if self.proc.exitcode is None:
                self.proc.kill()
                self.proc.join()
        self.conn.close()


def _pack_process(conn, spec_json: str, log_path: str) -> None:
    """A warm fleet: load the data once, then train each job sent (``None``: stop)."""
    import traceback

    import torch

    from ebb.cost.meter import packed
    from ebb.local.redis_server import die_with_parent
    from ebb.tune.trial import run_job, warm_fleet

    die_with_parent()  # a search killed outright takes its packs with it; --resume runs them again
    torch.set_num_threads(1)

    def log_to(path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

    log_to(log_path)
    conn.send(warm_fleet(JobSpec.model_validate_json(spec_json)))
    while (job := conn.recv()) is not None:
        folder, to_steps, redis_url, budget = job
        log_to(os.path.join(folder, "log.txt"))
        try:
            with packed():
                code = run_job(folder, to_steps, redis_url, budget, warm=True)
        except Exception:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        log_to(log_path)
        conn.send(code)


def price_pack(record: dict[str, Any], spec: JobSpec) -> None:
    """What ``record``'s pack pays once, priced (``usd``, ``by_component``)."""
    from ebb.cost.meter import pack_cost

    # A decision reads the trial's outcome from its checkpoints (latest.json, the supervisor's
    # state, the best scoring, a worker's checkpoint) and writes the search's state.
    record["seconds"] = round(record["start_seconds"] + record["decide_seconds"], 4)
    record["object_gets"] = record["loads"] + 4 * record["decisions"]
    cost = pack_cost(
        spec,
        seconds=record["seconds"],
        waves=record.get("waves", 1),
        object_gets=record["object_gets"],
        object_puts=record["decisions"],
        transitions=record.get("transitions", 0),  # (a stack's pack: each job's own states)
    )
    record["usd"] = cost["total_usd"]
    record["by_component"] = cost["by_component"]


def _share(record: dict[str, Any]) -> None:
    """Share what a pack paid once among the trials it trained, by their fleet seconds in it
    (all of it on its first job's trial until a job has trained)."""
    seconds: dict[str, float] = {}
    for j in record["jobs"]:
        seconds[str(j["trial"])] = seconds.get(str(j["trial"]), 0.0) + j["seconds"]
    total = sum(seconds.values())
    if total > 0:
        record["shares"] = {k: record["usd"] * v / total for k, v in seconds.items()}
    else:
        record["shares"] = {str(record["first_trial"]): record["usd"]}


def _add_pack_share(path: Path, share: float) -> None:
    """A trial's report with its share of its packs' fixed cost: ``cost.pack_usd``, and
    ``cost.total_usd`` = its jobs' (``cost.job_usd``) + that (written again the same on a rerun)."""
    report = json.loads(path.read_text())
    if with_pack_share(report, share):
        path.write_text(json.dumps(report, indent=2))


def with_pack_share(report: dict[str, Any], share: float) -> bool:
    """``report`` with its trial's pack share (``_add_pack_share``); False when it has no cost."""
    cost = report.get("cost")
    if not cost:
        return False
    job = cost.get("job_usd", cost["total_usd"])
    cost.update({"job_usd": job, "pack_usd": share, "total_usd": job + share})
    return True


def _num_parts(spec: JobSpec) -> int:
    from ebb.ports.manifest import load_manifest
    from ebb.stores import open_object_store

    return len(load_manifest(open_object_store(spec.data), spec.data).train.parts)


def _fleet_wall(search: Search) -> float:
    """The search's time on a fleet running every job of a rung at once, on the trials' own
    clock: the longest job of each rung, summed (how the AWS design would run it, docs/AWS.md).
    A ladder sized from the base trial runs the base trial's job alone first (its own pass)."""
    longest: dict[tuple[int, int], float] = {}
    done: dict[int, float] = {}
    for launch in search.launches:
        t = search.trials[launch["trial"]]
        share = (launch["to_epochs"] - launch["from_epochs"]) / t.epochs if t.epochs else 0.0
        secs = min(t.wall_seconds * share, t.wall_seconds - done.get(t.id, 0.0))
        done[t.id] = done.get(t.id, 0.0) + secs
        step = (launch["rung"], launch["to_epochs"])
        longest[step] = max(longest.get(step, 0.0), secs)
    return sum(longest.values())


def _params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in params.items())


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def leaderboard_text(result: dict[str, Any], loss_name: str, where: str = "here") -> str:
    """The leaderboard as a table: trial, settings, best validation, epochs, status, $
    (``where`` the search ran: "here", "on the stack")."""
    lines = [f"{'trial':>5}  {'val ' + loss_name:>12}  {'epochs':>6}  {'status':<13} {'$':>8}  settings"]
    for r in result["trials"]:
        val = f"{r['best_val']:.4f}" if r["best_val"] is not None else "-"
        lines.append(
            f"{r['trial']:>5}  {val:>12}  {r['epochs']:>6.1f}  {r['status']:<13} {r['cost_usd']:>8.4f}  "
            f"{_params_text(r['params'])}"
        )
    fleets = (
        f"{len(result['packs'])} trial pack(s), ${result['packs_usd']:.4f} of it paid once by them"
        if result.get("packs")
        else "a fleet running each rung at once"
    )
    lines.append(
        f"total ${result['total_usd']:.4f}; {len(result['trials'])} trials in {result['wall_seconds']:.1f} s {where} "
        f"({result['fleet_wall_seconds']:.1f} s on {fleets})"
    )
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in rows:
        if r["curve"]:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, marker="o", ms=2.5, lw=1, label=f"t{r['trial']}")
    ax.set_xlabel("epochs (one worker's pace)")
    ax.set_ylabel(f"validation ({'rmse' if model == 'pmf' else 'logloss'})")
    ax.set_title("ebb tune: validation per trial")
    if 0 < len(rows) <= 12 and any(r["curve"] for r in rows):
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
