"""The settings mypy's Django plugin loads (pyproject.toml, [tool.django-stubs]): the real
ones, with a placeholder key. The plugin imports the settings to learn the models and
runs nothing; collab.settings alone refuses to load without DJANGO_SECRET_KEY.
Never a server's settings."""

import os

os.environ.setdefault("DJANGO_SECRET_KEY", "typecheck-only-" + "never-signs-anything-" * 3)

from collab.settings import *  # noqa: F403
