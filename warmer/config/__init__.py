"""Configuration: the settings tree (TOML file + WARMER_* env), model profiles, and whole-config validation.

May import only `warmer.core` (layer contract). Nothing here is built at import time: callers load.
"""
