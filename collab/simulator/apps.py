from django.apps import AppConfig


class SimulatorConfig(AppConfig):
    name = "collab.simulator"
    label = "simulator"
    verbose_name = "Simulated model server"
    default_auto_field = "django.db.models.BigAutoField"
