"""Hand a 0/1 program to the CBC binary and read its answer back, within a hard wall-clock budget.

The one I/O the pure core (hopsmgr.core) is allowed, kept outside it so the core's modules import no
os/subprocess (tests/unit/test_core_purity.py): hopsmgr.core.ilp calls `run` with the CBC binary PuLP
bundles. The program is written as a fixed-format MPS file straight from its columns
(no PuLP objects: at thousands of variables PuLP's build and MPS writer cost more than CBC's solve),
CBC runs as a subprocess in a session of its own, and the solution file is parsed. CBC's own `-sec`
limit is not a deadline (reading, preprocessing and the root LP are not interrupted), so the caller's
budget is enforced here: at the budget CBC gets SIGINT (it then stops and writes its incumbent), and a
moment later the whole process group is killed. Whatever solution file exists is read.

The caller names the binary (hopsmgr.core.ilp: PuLP's bundled CBC, or the `cbc_path` setting).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# After SIGINT, CBC writes its incumbent within milliseconds; a stuck process is killed after this.
_GRACE_S = 0.15

Column = tuple[float, Sequence[tuple[int, float]]]  # (objective coefficient, ((row, coefficient), ...))


@dataclass(frozen=True, slots=True)
class CbcResult:
    status: str  # "optimal", "feasible" (an incumbent, not proven), "infeasible", "none" (no answer)
    values: list[float] = field(default_factory=list)
    reduced_costs: list[float] = field(default_factory=list)
    killed: bool = False  # the budget ran out and CBC was stopped from outside
    write_s: float = 0.0  # time spent writing the program (on the caller's timer)


def write_mps(path: str, columns: Sequence[Column], rhs: Sequence[float], integer: bool) -> None:
    """max sum c_j x_j s.t. rows <= rhs, 0 <= x <= 1 (binary if integer), written as min of -c.

    Not `-max`: CBC 2.10 then costs a MIP start with the wrong sign and discards it. Row fields and
    coefficients (a few distinct GPU counts) are formatted once: at 60,000 columns the writer took
    a quarter of a second formatting the same strings again."""
    rows = [f"r{r:<7}" for r in range(len(rhs))]
    coefficient: dict[float, str] = {}
    lines = ["NAME          hops", "ROWS", " N  OBJ"]
    lines += [f" L  r{r}" for r in range(len(rhs))]
    lines.append("COLUMNS")
    if integer:
        lines.append("    MARK      'MARKER'                 'INTORG'")
    append = lines.append
    for j, (cost, entries) in enumerate(columns):
        head = f"    {f'x{j}':<8}  "
        if cost != 0:
            append(f"{head}OBJ       {-cost:.12g}")
        for r, a in entries:
            text = coefficient.get(a)
            if text is None:
                text = coefficient[a] = f"{a:.12g}"
            append(f"{head}{rows[r]}  {text}")
    if integer:
        lines.append("    MARK      'MARKER'                 'INTEND'")
    lines.append("RHS")
    lines += [f"    RHS       {rows[r]}  {b:.12g}" for r, b in enumerate(rhs)]
    lines.append("BOUNDS")
    if integer:
        lines += [f" BV BND       x{j:<7}" for j in range(len(columns))]
    else:
        lines += [f" UP BND       x{j:<7}  1" for j in range(len(columns))]
    lines.append("ENDATA\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def read_solution(path: str, n_columns: int) -> CbcResult:
    """Parse CBC's solution file: a status line, then `index name value reduced-cost` per row/column."""
    values = [0.0] * n_columns
    costs = [0.0] * n_columns
    with open(path) as f:
        head = f.readline().split()
        for line in f:
            parts = line.split()
            if parts and parts[0] == "**":  # CBC marks infeasible entries
                parts = parts[1:]
            if len(parts) < 4 or not parts[1].startswith("x"):
                continue
            j = int(parts[1][1:])
            if 0 <= j < n_columns:
                values[j] = float(parts[2])
                costs[j] = -float(parts[3])  # back to the maximisation's sign
    if not head:
        return CbcResult("none")
    if head[0] == "Optimal":
        status = "optimal"
    elif head[0] in ("Infeasible", "Integer", "Unbounded"):
        status = "infeasible"
    elif len(head) >= 5 and head[4] == "objective":  # "Stopped on time - objective value ..."
        status = "feasible"
    else:
        status = "none"
    return CbcResult(status, values, costs)


def run(
    columns: Sequence[Column],
    rhs: Sequence[float],
    *,
    integer: bool,
    gap: float,
    budget_s: float,
    warm_start: Sequence[int] = (),
    path: str,
    timer: Callable[[], float] | None = None,
    abs_gap: float | None = None,
    light: bool = False,
) -> CbcResult:
    """Solve with CBC within `budget_s` wall seconds (hard): the answer, an incumbent, or "none".

    `abs_gap`: stop once the incumbent is within this much of the bound (CBC's allowableGap), beside
    the relative `gap`. `light`: no Gomory nor probing cuts, no strong branching, no primal heuristics
    (the warm start is the incumbent): on the neighbourhood programs of 512-1,024 GPUs these cost most
    of the time and found no better plans (0.17-0.34 s instead of 0.5-1.1 s on the slowest ones)."""
    if budget_s <= 0:
        return CbcResult("none", killed=True)
    clock = timer or (lambda: 0.0)
    started = clock()
    workdir = tempfile.mkdtemp(prefix="hops-cbc-")
    try:
        mps = os.path.join(workdir, "p.mps")
        sol = os.path.join(workdir, "p.sol")
        write_mps(mps, columns, rhs, integer)
        args = [path, mps]
        if integer and warm_start:
            mst = os.path.join(workdir, "p.mst")
            chosen = set(warm_start)
            with open(mst, "w") as f:
                f.write("Stopped on time - objective value 0\n")
                f.writelines(f"{j} x{j} {1 if j in chosen else 0} 0\n" for j in range(len(columns)))
            args += ["-mips", mst]
        # CBC's own limit (whole seconds) as a hint; the budget below is what holds.
        args += ["-sec", str(max(1, math.ceil(budget_s)))]
        if integer:
            # No `threads`: CBC's threaded search idled until its time limit on tiny programs.
            args += ["-ratio", repr(gap), "-preprocess", "off"]
            if abs_gap is not None and abs_gap > 0:
                args += ["-allowableGap", repr(abs_gap)]
            if light:
                args += ["-gomoryCuts", "off", "-probingCuts", "off", "-strongBranching", "0"]
                args += ["-heuristicsOnOff", "off"]
            args += ["-solve"]
        else:
            args += ["-initialSolve", "-printingOptions", "all"]
        args += ["-solution", sol]
        written = clock()
        # Writing took part of the budget: CBC gets what is left of it.
        killed = _run_until(args, budget_s - (written - started))
        write_s = written - started
        if not os.path.exists(sol):
            return CbcResult("none", killed=killed, write_s=write_s)
        try:
            result = read_solution(sol, len(columns))
        except (OSError, ValueError):
            return CbcResult("none", killed=killed, write_s=write_s)
        return CbcResult(result.status, result.values, result.reduced_costs, killed, write_s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_until(args: list[str], budget_s: float) -> bool:
    """Run CBC; past `budget_s` interrupt it (it writes its incumbent), then kill it. True if stopped.

    Waiting is on CBC's output pipe (`communicate`), which wakes the moment CBC exits; `wait(timeout)`
    polls in steps of up to 50 ms, a lot beside a 30-ms LP.
    """
    if budget_s <= 0:
        return True
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a wrapper script's children go with it
        )
    except OSError:
        return False
    first = max(0.0, budget_s - _GRACE_S) if budget_s > 2 * _GRACE_S else budget_s
    try:
        proc.communicate(timeout=first)
        return False
    except subprocess.TimeoutExpired:
        pass
    if first < budget_s:
        _signal_group(proc, signal.SIGINT)
        try:
            proc.communicate(timeout=budget_s - first)
            return True
        except subprocess.TimeoutExpired:
            pass
    _signal_group(proc, signal.SIGKILL)
    proc.communicate()
    return True


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
