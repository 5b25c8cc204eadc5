"""Who makes a request and what the master's views may read: `Principal` (a user of a tenant, a tenant
admin, an admin or the agents, and whose jobs it acts for) and `StateView` (read-only access to the
state machine's live jobs and open attempts and the master's node records, as `Controller.state`).
Neither changes anything; the controller (hopsmgr.master.controller) owns the state they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hopsmgr.control.records import Attempt, ControlState, Job
from hopsmgr.master.state import NodeRecord
from hopsmgr.master.store import Row


@dataclass(frozen=True, slots=True)
class Principal:
    """Who makes a request: a user of a tenant; an admin (everything), a tenant admin (the tenant's
    jobs), or the agents (the cluster token, heartbeats only)."""

    user: str
    tenant: str
    admin: bool = False
    agent: bool = False
    tenant_admin: bool = False

    def acts_for(self, row: Row) -> bool:
        """Whether this principal may see a job in full (command, env, logs) and cancel it."""
        if self.admin:
            return True
        if row["tenant"] != self.tenant:
            return False
        return self.tenant_admin or row["user"] == self.user


class StateView:
    """Read-only access to live jobs, open attempts (the machine's) and nodes (the master's), for views."""

    def __init__(self, control: ControlState, nodes: dict[str, NodeRecord]) -> None:
        self.control = control
        self.nodes = nodes

    @property
    def jobs(self) -> dict[str, Job]:
        return self.control.jobs

    @property
    def attempts(self) -> dict[str, Attempt]:
        return self.control.attempts

    @property
    def tenants(self) -> dict[str, Any]:
        return self.control.tenants

    @property
    def total_gpus(self) -> int:
        return self.control.total_gpus

    def held(self) -> dict[str, int]:
        return self.control.held()

    def attempts_on(self, node_id: str) -> list[Attempt]:
        return sorted(self.control.attempts_on(node_id), key=lambda a: a.id)
