"""Application services: the warm executor, the reconciler and friends, speaking only through ports."""
