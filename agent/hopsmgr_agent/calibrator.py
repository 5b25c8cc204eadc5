"""One node's calibration runs: one at a time, watched by a background thread, saved to the work directory.

Each run is a child process, `python -m hopsmgr_agent.calibrate`, so that torch, its CUDA contexts and
cached GPU memory (hundreds of MB per GPU) leave with it instead of staying in the long-lived agent, and
so that a crashing kernel cannot take the agent down. A thread waits for the child (and kills it when the
agent stops or the run overruns twice its budget), so heartbeats never wait: they carry
`Calibrator.latest` (factors and source of the last finished run, or None), replaced in one assignment
when a run ends. The raw report is <workdir>/calibration.json; with calibrate = "never" the agent reports
the one saved there. A failed run leaves the previous result in place and its reason in `error`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import structlog

from hopsmgr_agent.calibrate import CalibrationError, CalibrationReport, Cancelled
from hopsmgr_agent.config import AgentConfig

log = structlog.get_logger("hopsmgr.agent")


class Calibrator:
    def __init__(self, config: AgentConfig, gpu_type: str) -> None:
        self.config = config
        self.gpu_type = gpu_type
        self.device = "gpu" if config.devices == "nvml" else "cpu"
        self.latest: tuple[dict[str, float], str] | None = None  # (factors, source), swapped whole
        self.report: CalibrationReport | None = None
        self.runs = 0
        self.error = ""
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()

    @property
    def path(self) -> Path:
        return Path(self.config.workdir) / "calibration.json"

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, reason: str) -> bool:
        """Start a run in a background thread; False when one is already running or the agent stops."""
        if self.running() or self._cancel.is_set():
            log.info("calibration_not_started", node=self.config.node, reason=reason, running=self.running())
            return False
        self._thread = threading.Thread(
            target=self._run, args=(reason,), name="hopsmgr-calibration", daemon=True
        )
        self._thread.start()
        return True

    def cancel(self) -> None:
        """Stop a running calibration (its child is killed) and start no more: the agent is stopping."""
        self._cancel.set()

    def stop(self, timeout_s: float) -> None:
        """cancel(), and wait up to timeout_s for the child to be gone."""
        self.cancel()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def command(self) -> list[str]:
        c = self.config
        cmd = [sys.executable, "-m", "hopsmgr_agent.calibrate", "--device", self.device]
        cmd += ["--budget", str(c.calibration_budget_s), "--gpu-type", self.gpu_type]
        cmd += ["--workdir", c.workdir, "--json", str(self.path)]
        for host, port in c.peers:
            cmd += ["--peer", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        return cmd

    def _run(self, reason: str) -> None:
        c = self.config
        log.info("calibration_started", node=c.node, reason=reason, budget_s=c.calibration_budget_s)
        try:
            report = self._child()
        except Cancelled:
            log.info("calibration_cancelled", node=c.node)
            return
        except (CalibrationError, OSError, ValueError, TypeError) as exc:
            self.error = str(exc)
            log.error("calibration_failed", node=c.node, error=self.error)
            return
        self._use(report)
        self.error = ""
        self.runs += 1
        log.info(
            "calibration_done",
            node=c.node,
            wall_s=round(report.wall_s, 2),
            source=report.source,
            factors=report.factors(),
            notes=report.notes,
        )

    def _child(self) -> CalibrationReport:
        """Run the kernels in a child process and read the report it saved."""
        limit = 2 * self.config.calibration_budget_s + 60  # torch import and warm-ups come on top
        deadline = time.monotonic() + limit
        proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C reaches the agent, which then stops it
        )
        stderr = ""
        while True:
            try:
                _, stderr = proc.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if self._cancel.is_set() or time.monotonic() > deadline:
                    proc.kill()
                    proc.communicate()
                    if self._cancel.is_set():
                        raise Cancelled from None
                    raise CalibrationError(
                        f"the calibration run took over {limit:g} s and was stopped"
                    ) from None
        if proc.returncode != 0:
            lines = [line for line in stderr.strip().splitlines() if line.strip()]
            last = lines[-1] if lines else f"exit status {proc.returncode}"
            raise CalibrationError(last.removeprefix("error: "))
        return CalibrationReport.from_json(json.loads(self.path.read_text()))

    def _use(self, report: CalibrationReport) -> None:
        self.report = report
        self.latest = (report.factors(), report.source)

    def load_saved(self) -> bool:
        """Use the report an earlier run saved, if there is one for this kind of device."""
        try:
            report = CalibrationReport.from_json(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return False
        except (OSError, ValueError, TypeError) as exc:
            log.warning("saved_calibration_unreadable", path=str(self.path), error=str(exc))
            return False
        if report.device != self.device:
            log.warning("saved_calibration_other_device", path=str(self.path), device=report.device)
            return False
        self._use(report)
        return True
