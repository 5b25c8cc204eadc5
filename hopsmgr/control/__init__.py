"""The scheduler as a sans-io state machine: events in, commands out, `now` passed in.

hopsmgr.control.machine holds the decisions; the simulator (hopsmgr.sim.engine) and the master drive it.
"""
