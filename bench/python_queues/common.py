"""What every side of bench.python_queues measures with: consumer processes, the drain's clock,
the lateness phase's schedule and figures."""
import subprocess
import tempfile
import time
from dataclasses import dataclass

from bench.harness import percentile
from tools.stack import ROOT

LEAD_S = 3  # after the consumers are up, every send is done before the first message falls due
SENDS_PER_S_AT_WORST = 500  # the lead also covers the lateness sends at this rate (huey, loaded machine)


@dataclass(frozen=True)
class Phases:
    """How big each phase is: `messages` per enqueue and drain row; the lateness phase's messages
    fall due at `due_rate` a second, spread over `due_seconds`."""
    messages: int
    due_rate: int
    due_seconds: int

    @property
    def warm_up(self) -> int:
        """Untimed enqueues before a side's first timed one, so that no side's row pays for its
        server's or client's first calls (BullMQ's addBulk already runs after its sequential adds)."""
        return max(1, self.messages // 5)

    @property
    def due_messages(self) -> int:
        return self.due_rate * self.due_seconds

    @property
    def lead_s(self) -> float:
        return LEAD_S + self.due_messages / SENDS_PER_S_AT_WORST


def start_processes(argv: list[str], count: int, env: dict, cwd=ROOT) -> list[subprocess.Popen]:
    """`count` copies of a consumer process; each one's stderr goes to a scratch file, shown if it dies."""
    procs = []
    for _ in range(count):
        log = tempfile.TemporaryFile()
        procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=log))
        procs[-1].log = log
    return procs


def check_alive(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            proc.log.seek(0)
            raise SystemExit(f"{proc.args} exited with {proc.returncode}:\n{proc.log.read().decode()}")


def time_drain(left, total: int, procs: list[subprocess.Popen], timeout: float = 300) -> float:
    """msg/s of a drain, from the first poll that sees the backlog (`left()`) below `total` to the
    first that sees it empty; the messages taken before the clock started are not counted."""
    deadline = time.monotonic() + timeout
    while (remaining := left()) >= total:
        check_alive(procs)
        if time.monotonic() > deadline:
            raise SystemExit("the consumers took nothing")
        time.sleep(0.01)
    started, counted = time.perf_counter(), remaining
    while left() > 0:
        check_alive(procs)
        if time.monotonic() > deadline:
            raise SystemExit(f"the drain did not end: {left()} left")
        time.sleep(0.01)
    return counted / (time.perf_counter() - started)


def wait_until_recorded(recorded, count: int, procs: list[subprocess.Popen], timeout: float) -> None:
    """Waits until `recorded()` reaches `count` (the lateness phase's handlers all ran)."""
    deadline = time.monotonic() + timeout
    while recorded() < count:
        check_alive(procs)
        if time.monotonic() > deadline:
            raise SystemExit(f"{recorded()} of {count} lateness tasks ran")
        time.sleep(0.1)


def check_lead(first_due_s: float) -> None:
    if time.time() > first_due_s:
        raise SystemExit("the lateness phase's sends took longer than their lead: its figures would count them")


def lateness_figures(values: list[float]) -> tuple[float, float, float, int]:
    """p50, p99, max (ms) and how many were early."""
    return percentile(values, 50), percentile(values, 99), max(values), sum(1 for v in values if v < 0)


def show_lateness(label: str, figures: tuple[float, float, float, int]) -> None:
    p50, p99, worst, early = figures
    print(f"  {label}: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms, early {early}", flush=True)


def show_rate(label: str, rate: float) -> None:
    print(f"  {label}: {rate:,.0f} msg/s", flush=True)
