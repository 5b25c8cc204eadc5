"""The product on one machine: a local cluster of a master and emulated-device agents, and the demo."""
