"""collab.web before it serves: the application named on Daphne's command line is
imported, and what start-up made is frozen out of the garbage collector's sight."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from collab.web import freeze_startup


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # this test process goes on as it was


@pytest.mark.usefixtures("unfrozen")
def test_start_up_is_frozen_once_the_named_application_is_imported() -> None:
    assert not freeze_startup(["-b", "127.0.0.1", "-p", "8000"])  # no application named: nothing done
    assert gc.get_freeze_count() == 0
    assert freeze_startup(["-b", "127.0.0.1", "-p", "8000", "--proxy-headers", "collab.asgi:application"])
    assert "collab.asgi" in sys.modules
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # Django, the app and the libraries
    made_after = [object() for _ in range(10)]
    assert gc.get_freeze_count() == frozen and made_after  # what comes later is collected as before


@pytest.mark.usefixtures("unfrozen")
def test_an_application_that_cannot_be_imported_fails_before_serving() -> None:
    with pytest.raises(ModuleNotFoundError):
        freeze_startup(["collab.no_such_module:application"])
    assert gc.get_freeze_count() == 0
