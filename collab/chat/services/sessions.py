"""A session that ends closes its open sockets, on every process: a logout, an expiry, a
session deleted (staff, `clearsessions`), and an account that changes under it (the user
deactivated or deleted, or their password changed: Django's session auth hash)."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_out
from django.contrib.sessions.models import Session
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver
from django.http import HttpRequest
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from collab.chat import broadcast


@receiver(user_logged_out)
def close_the_sessions_sockets(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    # Sent before Django flushes the session: its key still names the sockets to close.
    session_key = request.session.session_key
    if user is not None and session_key:
        broadcast.to_user_sync(user.pk, {"type": "session.ended", "session_key": session_key})


def session_seconds_left(session_key: str | None) -> float | None:
    """Seconds until the session expires, as the database has it now (it may have been
    renewed, or ended: then 0); None without a session store that keeps expiry dates."""
    if not session_key:
        return None
    engine = import_module(settings.SESSION_ENGINE)
    store = engine.SessionStore(session_key)
    if not hasattr(store, "get_model_class"):  # not a database-backed store
        return None
    row = store.get_model_class().objects.filter(session_key=session_key).values("expire_date").first()
    if row is None:
        return 0.0
    return max(0.0, (row["expire_date"] - timezone.now()).total_seconds())


# --- an account that changes under its sessions ------------------------------------------------

_CHANGED = "_collab_account_changed"  # set on the instance between pre_save and post_save


@receiver(pre_save, sender=User)
def _note_account_change(sender: Any, instance: User, update_fields: Any = None, **kwargs: Any) -> None:
    if instance.pk is None or (update_fields is not None and not {"password", "is_active"} & set(update_fields)):
        return  # a new user, or a save of other fields (a login's last_login): no read
    before = User.objects.filter(pk=instance.pk).values_list("password", "is_active").first()
    changed = before is not None and (before[0] != instance.password or (before[1] and not instance.is_active))
    setattr(instance, _CHANGED, changed)


@receiver(post_save, sender=User)
def _account_saved(sender: Any, instance: User, **kwargs: Any) -> None:
    if getattr(instance, _CHANGED, False):
        setattr(instance, _CHANGED, False)
        broadcast.to_user_after_commit(instance.pk, {"type": "account.changed"})


@receiver(post_delete, sender=User)
def _account_deleted(sender: Any, instance: User, **kwargs: Any) -> None:
    broadcast.to_user_after_commit(instance.pk, {"type": "account.changed"})


@receiver(post_delete, sender=Session)
def _session_deleted(sender: Any, instance: Session, **kwargs: Any) -> None:
    user_id = instance.get_decoded().get("_auth_user_id")
    if user_id is not None:
        broadcast.to_user_after_commit(int(user_id), {"type": "session.ended", "session_key": instance.session_key})


def account_refusal(user: User, auth_hash: str | None) -> str | None:
    """Why a socket opened with `auth_hash` (its session's, at connect) may no longer act
    for `user` as stored now, or None: deactivated, or the password changed since."""
    if not user.is_active:
        return "Your account was deactivated."
    if auth_hash is not None and not constant_time_compare(auth_hash, user.get_session_auth_hash()):
        return "Your password was changed; log in again."
    return None


def socket_refusal(user_id: int, session_key: str | None, auth_hash: str | None) -> tuple[str | None, str | None]:
    """Why a socket may no longer act for `user_id` as stored now (deleted, deactivated, its
    session gone or holding an older password's hash), or None; and its session's auth
    hash as stored now (the session that changed the password was given the new one)."""
    user = User.objects.filter(pk=user_id).first()
    if user is None:
        return "Your account was deleted.", auth_hash
    if session_key:
        stored = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        if not stored.exists(session_key):
            return "You have logged out.", auth_hash
        auth_hash = stored.get(HASH_SESSION_KEY, auth_hash)
    return account_refusal(user, auth_hash), auth_hash
