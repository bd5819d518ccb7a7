"""Login throttling by account and address (issue 33, item 7; README "Security"): wrong
passwords lock one account for the address they came from at COLLAB_LOGIN_FAILURES; the
address alone waits only at COLLAB_LOGIN_ADDRESS_FAILURES (many accounts tried). A team
behind one NAT is not locked out by one colleague's typos. Through the login form, the
whole middleware stack (django-axes) included."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db

NAT = "192.0.2.7"  # one address for a whole team
ELSEWHERE = "198.51.100.4"


@pytest.fixture
def team(settings: Any) -> dict[str, User]:
    settings.AXES_FAILURE_LIMIT = 3  # COLLAB_LOGIN_FAILURES
    settings.COLLAB_LOGIN_ADDRESS_FAILURES = 7
    return {name: User.objects.create_user(name, password=f"pw-{name}-123") for name in ("alice", "bob", "carol")}


def login(name: str, password: str, address: str = NAT) -> int:
    return Client().post("/accounts/login/", {"username": name, "password": password}, REMOTE_ADDR=address).status_code


def test_one_members_typos_lock_their_account_from_that_address_only(team: dict[str, User]) -> None:
    assert [login("alice", "typo") for _ in range(3)] == [200, 200, 429]  # the form again, then locked
    assert login("alice", "pw-alice-123") == 429  # her account, from here: waits
    assert login("bob", "pw-bob-123") == 302  # the colleague at the next desk: in
    assert login("bob", "typo") == 200  # and his own typo is only his
    assert login("alice", "pw-alice-123", ELSEWHERE) == 302  # alice, from home: in


def test_an_address_that_tries_many_accounts_waits_at_its_own_threshold(team: dict[str, User]) -> None:
    tried = [login(name, "guess") for name in ("alice", "bob", "dave", "erin", "frank", "gina")]
    assert 429 not in tried  # six failures, no account at its limit, the address under seven
    assert login("carol", "pw-carol-123") == 302  # another account's success does not wipe the address's count...
    assert login("mallory", "guess") == 429  # ...and the seventh failure locks the address
    assert login("bob", "pw-bob-123") == 429  # for every account
    assert login("bob", "pw-bob-123", ELSEWHERE) == 302


def test_a_successful_login_leaves_no_info_line_of_axes_in_the_log(team: dict[str, User]) -> None:
    """Issue 34: axes' lines for every login are DEBUG, not INFO; its warnings stay."""
    console = next(h for h in logging.getLogger().handlers if h.get_name() == "console")
    assert isinstance(console, logging.StreamHandler)
    written = io.StringIO()
    before = console.setStream(written)
    try:
        assert login("alice", "pw-alice-123") == 302
        assert [login("bob", "typo") for _ in range(3)][-1] == 429
    finally:
        console.setStream(before)
    lines = [line for line in written.getvalue().splitlines() if " axes." in line]
    assert not [line for line in lines if " INFO " in line], lines
    assert any(" WARNING " in line and "Locking out" in line for line in lines), lines
