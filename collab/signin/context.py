from django.conf import settings
from django.http import HttpRequest


def sign_in(request: HttpRequest) -> dict[str, bool]:
    """Whether pages offer the password form and signup (COLLAB_PASSWORD_LOGIN)."""
    return {"password_login": bool(settings.COLLAB_PASSWORD_LOGIN)}
