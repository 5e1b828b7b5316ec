"""Build glue pyproject.toml cannot express: the repository-root `models/` (model profiles and their
tokenizer files) and `migrations/` (Alembic's script directory) ship inside the package as
`warmer/models` and `warmer/migrations`, so an installed wheel has its default profile set and can
migrate its own database. `warmer.shipped` finds them in either layout."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["warmer", "warmer.*"]),
        "warmer.models",
        "warmer.migrations",
        "warmer.migrations.versions",
    ],
    package_dir={"warmer.models": "models", "warmer.migrations": "migrations"},
    package_data={
        "warmer": ["py.typed"],
        "warmer.models": ["*.toml", "*.json", "*.jinja"],
        "warmer.migrations": ["*.py", "*.mako"],
        "warmer.migrations.versions": ["*.py"],
    },
)
