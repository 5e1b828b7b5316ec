"""Real engines for warmer's tests and demo: a llama-server build, a generated model, a local fleet.

Nothing here is part of the daemon; it is the test bench the daemon is exercised against.
"""
