"""The composition root: builds everything from settings and supervises the named root tasks."""
