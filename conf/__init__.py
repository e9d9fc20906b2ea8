"""The config tree, shipped as the package `ablate.conf` (see pyproject.toml). Importing it registers the schema."""

from ablate.schema import register

register()
