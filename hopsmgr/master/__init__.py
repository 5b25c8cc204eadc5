"""The master daemon: SQLite state, REST API, heartbeats, the round loop and the executors."""
