"""The master's settings, re-exported from their neutral home `hopsmgr.master_settings`.

They live outside `hopsmgr.master` so that `hopsmgr.config` (which every process loads) does not import
the master package.
"""

from hopsmgr.master_settings import EXECUTORS, LOOPBACK_HOSTS, MasterSettings

__all__ = ["EXECUTORS", "LOOPBACK_HOSTS", "MasterSettings"]
