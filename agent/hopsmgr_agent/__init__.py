"""The hopsmgr node agent: one per server; reports devices, calibration and attempts; reaps strays."""

__version__ = "0.1.0"
