"""Memory over a long run: the async CartPole pipeline for N minutes, every process's memory sampled.

    python benchmarks/memory_long_run.py                          # 30 minutes, a sample every 30 s
    python benchmarks/memory_long_run.py --minutes 3 --interval 10
    python benchmarks/memory_long_run.py --out /tmp/mem.jsonl --extra async_pipeline.num_collector_actors=2

Starts ``sota-implementations/muzero/muzero_async.py`` (CartPole, no early stop, a wall-clock limit
of ``--minutes``, a small buffer that is full within the first minutes) and samples its process tree
from ``/proc`` every ``--interval`` seconds: RSS of each process, and from ``/proc/PID/smaps_rollup``
its PSS and USS. The workers are spawned, not forked, but torch's shared-memory tensors (the
collector's batches) and the shared libraries' pages are still mapped by several processes, so a sum
of RSS counts them more than once: the "total" rows sum PSS (each shared page split among its users)
and USS (the pages of one process alone).

Each process is labelled from the tree: the script's process is the driver (learner + replay
buffer); its children started by ``multiprocessing`` are, in order of start, the collector workers
(the trainer builds the collector first) and then the evaluators, as many as the run's
``config.json`` says; ``multiprocessing``'s resource tracker by its command line; anything else
"other". The buffer's fill is read at each sample from the run's CSV log
(``logs/scalars/buffer/size.csv``, logged at every collected batch with the env steps so far); the
buffer is full once the run has written ``--capacity`` transitions. The growth is measured from the
first sample with a full buffer (before that the driver's memory grows with the buffer's content
and the allocator's first pools, as it should) to the last sample of the run (samples after ``--minutes``, the shutdown, are kept in the file but not in the figures).

Writes ``--out`` (JSON lines: one ``run`` line, one ``sample`` line per process per sample, one
``summary`` line) and prints the summary table. The goal is fixed: at most 5 % growth after
buffer-full, both end-to-end and along the least-squares trend. The run folder is a new folder under
``$MEMORY_LONG_RUN_DIR`` (default: the temp folder). Leaves no process: the run stops on its own at
its wall-clock limit; past a grace period it gets SIGTERM, then SIGKILL, and any process left in its
session is ended and reported.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "sota-implementations" / "muzero" / "muzero_async.py"
GOAL_PCT = 5.0  # the goal: flat after the buffer is full, within 5 %
MB = 1024.0  # /proc reports kB
# past --minutes the run still writes its last checkpoint and buffer, then joins its workers
# (async_pipeline.shutdown_timeout_s = 30 each); SIGTERM only once that should long be over
SHUTDOWN_GRACE_S = 180.0


# -- /proc -------------------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, session id, start time in clock ticks) of ``pid``, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[1]), int(fields[3]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _kv_file(path: str, keys: set[str]) -> dict[str, float]:
    """The ``Key: N kB`` lines of a /proc file, in MB (those in ``keys``)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in keys:
                    out[key] = int(rest.split()[0]) / MB
    except (OSError, ValueError, IndexError):
        pass
    return out


def memory_of(pid: int) -> dict | None:
    """RSS (and its anon / file / shmem parts) from ``status``; PSS, USS, swap from ``smaps_rollup``.

    ``smaps_rollup`` walks the process's mappings once in the kernel: a few ms for these processes,
    nothing next to a 30 s interval. USS = private clean + private dirty pages.
    """
    status = _kv_file(f"/proc/{pid}/status", {"VmRSS", "RssAnon", "RssFile", "RssShmem", "VmSwap"})
    if "VmRSS" not in status:
        return None  # gone, or a zombie (no memory left to report)
    roll = _kv_file(f"/proc/{pid}/smaps_rollup", {"Pss", "Private_Clean", "Private_Dirty"})
    try:
        threads = int(next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("Threads:")))
        fds = len(os.listdir(f"/proc/{pid}/fd"))  # a descriptor leak shows here before it shows in memory
    except (OSError, StopIteration):
        threads = fds = None
    out = dict(rss_mb=status["VmRSS"], rss_anon_mb=status.get("RssAnon"), rss_file_mb=status.get("RssFile"),
               rss_shmem_mb=status.get("RssShmem"), swap_mb=status.get("VmSwap"), pss_mb=roll.get("Pss"),
               uss_mb=(roll["Private_Clean"] + roll["Private_Dirty"]) if "Private_Dirty" in roll else None,
               threads=threads, fds=fds)
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()}


def process_tree(root: int) -> dict[int, tuple[int, int]]:
    """``pid -> (ppid, start time)`` of ``root`` and all its descendants."""
    stats = {pid: s for pid in _all_pids() if (s := _stat(pid)) is not None}
    tree, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in stats:
            tree[pid] = (stats[pid][0], stats[pid][2])
            frontier.extend(c for c, s in stats.items() if s[0] == pid)
    return tree


def session_pids(sid: int) -> list[int]:
    """Processes still in session ``sid`` (the run was started in a new session: all its processes)."""
    return [pid for pid in _all_pids() if (s := _stat(pid)) is not None and s[1] == sid and pid != os.getpid()]


# -- the run's own logs ----------------------------------------------------------------------------
def last_csv_row(path: Path) -> tuple[float, float] | None:
    """The last complete ``step,value`` row of a torchrl CSV log that the run is still appending to."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").split("\n")[:-1]  # drop a line still being written
        step, value = lines[-1].split(",")
        return float(step), float(value)
    except (OSError, ValueError, IndexError):
        return None


class Labeller:
    """Roles of the run's processes; a pid keeps the role it got when first labelled."""

    def __init__(self, driver: int, run_dir: Path) -> None:
        self.driver, self.run_dir = driver, run_dir
        self.roles: dict[int, str] = {driver: "driver"}
        self.counts: tuple[int, int] | None = None

    def _read_counts(self) -> tuple[int, int] | None:
        try:  # written by the trainer at start, before it builds the collector and the evaluators
            ap = json.loads((self.run_dir / "config.json").read_text())["async_pipeline"]
            return int(ap["num_collector_actors"]), int(ap["num_evaluator_actors"])
        except (OSError, ValueError, KeyError):
            return None

    def label(self, tree: dict[int, tuple[int, int]]) -> dict[int, str]:
        if self.counts is None:
            self.counts = self._read_counts()
        spawned = sorted((start, pid) for pid, (ppid, start) in tree.items()
                         if ppid == self.driver and pid not in self.roles and "resource_tracker" not in _cmdline(pid))
        for pid, (ppid, _) in tree.items():
            if pid in self.roles:
                continue
            if ppid == self.driver and "resource_tracker" in _cmdline(pid):
                self.roles[pid] = "resource_tracker"
            elif ppid in self.roles and ppid != self.driver:
                self.roles[pid] = f"{self.roles[ppid]} child"  # e.g. a parallel env's workers
        if self.counts is not None and spawned:
            n_coll, n_eval = self.counts
            taken_c = sum(r.startswith("collector ") and not r.endswith("child") for r in self.roles.values())
            taken_e = sum(r.startswith("evaluator ") and not r.endswith("child") for r in self.roles.values())
            for _, pid in spawned:  # in order of start: collectors first, then evaluators
                if taken_c < n_coll:
                    self.roles[pid], taken_c = f"collector {taken_c}", taken_c + 1
                elif taken_e < n_eval:
                    self.roles[pid], taken_e = f"evaluator {taken_e}", taken_e + 1
                else:
                    self.roles[pid] = "other"
        return {pid: self.roles.get(pid, "unlabelled") for pid in tree}


# -- figures ---------------------------------------------------------------------------------------
def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / var if var else 0.0


def summarize(samples: list[dict], full_t: float | None, end_t: float, metric: str = "rss_mb") -> list[dict]:
    """Per role (and the PSS and USS totals): memory at buffer-full, at the end, the max, the growth after full.

    growth_pct: end against buffer-full; trend_pct: the least-squares line's rise over the same window
    (less sensitive to one sample caught mid-evaluation). PASS when both are within GOAL_PCT.
    """
    window_start = full_t if full_t is not None else end_t / 2  # never full: the second half of the run
    series: dict[str, list[tuple[float, float]]] = {}
    totals: dict[str, dict[float, float]] = {"pss_mb": {}, "uss_mb": {}}
    for s in samples:
        if not (window_start <= s["t"] <= end_t):
            continue
        if s.get(metric) is not None:
            series.setdefault(s["role"], []).append((s["t"], s[metric]))
        for key, total in totals.items():
            if s.get(key) is not None:
                total[s["t"]] = total.get(s["t"], 0.0) + s[key]
    # PSS splits each shared page among all its mappers, other programs on the machine included (a
    # test run loading the same torch libraries lowers our PSS): the USS sum, the memory the run
    # alone holds, is the steadier total; both are kept
    series["total (PSS)"] = sorted(totals["pss_mb"].items())
    series["total (USS)"] = sorted(totals["uss_mb"].items())
    rows = []
    for role, pts in series.items():
        if not pts:
            continue
        pts.sort()
        first, last = pts[0][1], pts[-1][1]
        span_min = (pts[-1][0] - pts[0][0]) / 60.0
        slope = slope_per_min(pts)
        growth = 100.0 * (last - first) / first if first else 0.0
        trend = 100.0 * slope * span_min / first if first else 0.0
        rows.append(dict(role=role, metric={"total (PSS)": "pss_mb", "total (USS)": "uss_mb"}.get(role, metric),
                         samples=len(pts),
                         at_full_mb=round(first, 1), end_mb=round(last, 1), max_mb=round(max(v for _, v in pts), 1),
                         growth_pct=round(growth, 2), slope_mb_per_min=round(slope, 3), trend_pct=round(trend, 2),
                         verdict="PASS" if max(growth, trend) <= GOAL_PCT else "FAIL"))
    return sorted(rows, key=lambda r: (r["role"].startswith("total"), r["role"]))


def table(rows: list[dict]) -> str:
    head = ("| role | at buffer-full (MB) | end (MB) | max (MB) | growth after full | slope (MB/min) "
            "| trend over window | vs 5 % |\n|---|---|---|---|---|---|---|---|")
    lines = [f"| {r['role']} | {r['at_full_mb']:.1f} | {r['end_mb']:.1f} | {r['max_mb']:.1f} | {r['growth_pct']:+.2f} % "
             f"| {r['slope_mb_per_min']:+.3f} | {r['trend_pct']:+.2f} % | {r['verdict']} |" for r in rows]
    return "\n".join([head, *lines])


# -- the run ---------------------------------------------------------------------------------------
def end_session(proc: subprocess.Popen, sid: int) -> list[int]:
    """Stop the run if it is still going and make sure nothing of it is left; the pids that had to be killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the script's clean stop: exit 143 after shutting its workers
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    killed = []
    deadline = time.monotonic() + 15  # daemonic workers end right after the driver; give them a moment
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.5)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(sid):
            try:
                os.kill(pid, sig)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(2)
    return sorted(set(killed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="the run's wall-clock limit")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--capacity", type=int, default=5000, help="buffer.capacity (transitions)")
    parser.add_argument("--out", default=None, help="JSON lines file (default: memory.jsonl in the run folder)")
    parser.add_argument("--extra", nargs="*", default=[], help="more hydra overrides for the run")
    args = parser.parse_args(argv)

    base = Path(os.environ.get("MEMORY_LONG_RUN_DIR", tempfile.gettempdir()))
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="memory_long_run_", dir=base))
    run_dir = folder / "run"
    out = Path(args.out) if args.out else folder / "memory.jsonl"
    duration = args.minutes * 60.0
    overrides = [
        f"run_dir={run_dir}", f"hydra.run.dir={folder / 'hydra'}", "logger.progress_bar=false",
        f"train.max_wall_time_s={duration}",
        "train.stop_return=0",              # CartPole's config stops at 475: never stop on return
        "train.total_env_steps=1000000000",  # nor on env steps: the wall clock alone ends the run
        f"buffer.capacity={args.capacity}",
        *args.extra,
    ]
    cmd = [sys.executable, str(SCRIPT), *overrides]
    print("run:", " ".join(cmd), flush=True)
    log = open(folder / "run.log", "w")
    # a session of its own: every process of the run can be found (and ended) by its session id
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    sid = proc.pid
    labeller = Labeller(proc.pid, run_dir)
    samples: list[dict] = []
    full_t = None
    t0 = time.monotonic()
    stop = {"signal": None}

    def on_signal(signum, _frame):  # a benchmark stopped early still stops its run and writes what it has
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    killed = []
    with open(out, "w") as f:
        f.write(json.dumps(dict(kind="run", cmd=cmd, minutes=args.minutes, interval_s=args.interval,
                                capacity=args.capacity, run_folder=str(folder), cpus=os.cpu_count(),
                                load_at_start=os.getloadavg()[0], started=time.strftime("%Y-%m-%d %H:%M:%S"))) + "\n")
        try:
            k = 0
            while proc.poll() is None and stop["signal"] is None:
                t = time.monotonic() - t0
                if t > duration + SHUTDOWN_GRACE_S:
                    print(f"the run overshot its limit by {SHUTDOWN_GRACE_S:.0f} s: SIGTERM", flush=True)
                    break
                tree = process_tree(proc.pid)
                roles = labeller.label(tree)
                size = last_csv_row(run_dir / "logs" / "scalars" / "buffer" / "size.csv")
                it = last_csv_row(run_dir / "logs" / "scalars" / "train" / "train_iter.csv")
                buffer_size = int(size[1]) if size else 0
                env_steps = int(size[0]) if size else 0
                # full = the run has written a capacity's worth of transitions: from then on every
                # batch evicts as much as it adds. (The buffer's length itself stays a little under
                # the capacity, ~4,950 of 5,000: it evicts whole episode tails, so it never equals it.)
                if full_t is None and env_steps >= args.capacity:
                    full_t = round(t, 1)  # the t the samples carry, so this sample opens the window
                shown = []
                for pid in sorted(tree):
                    mem = memory_of(pid)
                    if mem is None:
                        continue
                    shown.append(f"{roles[pid]}={mem['rss_mb']:.0f}")
                    s = dict(kind="sample", t=round(t, 1), pid=pid, role=roles[pid],
                             phase="run" if round(t, 1) <= duration else "shutdown",
                             buffer_size=buffer_size, env_steps=env_steps, train_iter=int(it[1]) if it else 0, **mem)
                    samples.append(s)
                    f.write(json.dumps(s) + "\n")
                f.flush()
                print(f"t={t:6.0f}s env_steps={env_steps} buffer={buffer_size} RSS MB: {'  '.join(shown)}", flush=True)
                k += 1
                try:  # wake at the next tick, or as soon as the run ends
                    proc.wait(timeout=max(0.0, k * args.interval - (time.monotonic() - t0)))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            killed = end_session(proc, sid)
            log.close()
        end_t = min(duration, max((s["t"] for s in samples), default=0.0))
        rows = summarize(samples, full_t, end_t)
        try:
            result = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            result = {}
        summary = dict(kind="summary", buffer_full_t=full_t, end_t=end_t, exit_code=proc.returncode,
                       killed_leftovers=killed, stopped_by_signal=stop["signal"], goal_pct=GOAL_PCT,
                       env_steps=result.get("env_steps"), train_iter=result.get("train_iter"),
                       episodes=result.get("episodes"), run_wall_s=result.get("wall_s"),
                       reason=result.get("reason"), load_at_end=os.getloadavg()[0], rows=rows)
        f.write(json.dumps(summary) + "\n")

    print(f"\nrun folder: {folder}\nsamples: {out}")
    print(f"exit code {proc.returncode} ({result.get('reason', 'no summary.json')}); "
          f"env steps {result.get('env_steps')}, updates {result.get('train_iter')}, episodes {result.get('episodes')}")
    print(f"buffer full ({args.capacity} transitions written) at t = {full_t:.0f} s" if full_t is not None
          else "the buffer never filled: the figures cover the second half of the run")
    print(f"window: t = {full_t if full_t is not None else end_t / 2:.0f} s to {end_t:.0f} s; "
          f"leftover processes killed: {killed or 'none'}\n")
    print(table(rows))
    failed = any(r["verdict"] == "FAIL" for r in rows)
    print(f"\n{'FAIL' if failed else 'PASS'}: growth after buffer-full {'exceeds' if failed else 'within'} {GOAL_PCT:.0f} %")
    return 1 if failed or killed else 0


if __name__ == "__main__":
    sys.exit(main())
