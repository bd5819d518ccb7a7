"""Login throttling by account and address (README "Security"; issue 33).

django-axes counts wrong passwords per (account, address) and per address. Its own
check compares the larger count with one limit, so one address's count locked every
account behind it at COLLAB_LOGIN_FAILURES: a team behind one NAT waited for one
colleague's typos. Here each count has its limit: an account from one address waits at
COLLAB_LOGIN_FAILURES (AXES_FAILURE_LIMIT); the address alone, for every account, only at
COLLAB_LOGIN_ADDRESS_FAILURES (many accounts tried). The account is never locked
everywhere: a stranger elsewhere cannot lock the real user out.
"""

from __future__ import annotations

from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_failure_limit
from django.conf import settings
from django.db.models import QuerySet, Sum
from django.http import HttpRequest


def _failures(attempts: QuerySet[Any]) -> int:
    return int(attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0)


class AccountAndAddressHandler(AxesDatabaseHandler):  # type: ignore[misc]
    """axes' database handler with a threshold per count (AXES_HANDLER). What axes counts,
    in this order, is AXES_LOCKOUT_PARAMETERS: the account from this address, then the
    address alone (get_user_attempts follows that order)."""

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """What axes compares with AXES_FAILURE_LIMIT: the account's count from this
        address, or the limit itself once the address's own count reached its threshold."""
        account, address = self.get_user_attempts(request, credentials)
        by_account = _failures(account)
        if _failures(address) >= settings.COLLAB_LOGIN_ADDRESS_FAILURES:
            return max(by_account, int(get_failure_limit(request, credentials)))
        return by_account

    def reset_user_attempts(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        """A successful login clears its account's failures from this address only: one
        account that logs in must not wipe the count of an address trying many others."""
        account = self.filter_user_attempts(request, credentials)[0]
        count, _ = account.delete()
        return int(count)
