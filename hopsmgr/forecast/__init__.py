"""Start and finish forecasts for waiting jobs: the scheduler state machine run forward in simulated time.

`hopsmgr.forecast.live` takes a copy of the live state (jobs, attempts, nodes, the estimator) and holds
what a forecast answers; `hopsmgr.forecast.future` restores that copy into
the simulator's driver (hopsmgr.sim.engine.Simulation) and runs it on; `hopsmgr.forecast.world` is the
simulator's world in which jobs run at the estimator's rates (each sampled future draws its own error
of them); `hopsmgr.forecast.policy` is the fast plan the futures use; `hopsmgr.forecast.forecast` turns
several futures into P10/P50/P90 per job within a time budget. All of it is pure: time comes in.
"""
