"""Adapters: the ports spoken over real I/O (engines over httpx, the SQL store, gateways)."""
