"""hopsmgr: an on-prem cluster manager for deep-learning training on heterogeneous GPU servers."""

__version__ = "0.1.0"
