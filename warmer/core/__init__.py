"""The pure core: domain structs, prefix rendering and lint, placement, the warm-state machine, planning.

Nothing here performs I/O or imports an I/O framework (enforced by import-linter).
"""
