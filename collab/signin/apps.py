from django.apps import AppConfig


class SigninConfig(AppConfig):
    name = "collab.signin"
    label = "signin"

    def ready(self) -> None:
        from collab.signin import adapters  # noqa: F401 (connects its user_logged_in receiver)
