from django.apps import AppConfig


class LoadtestConfig(AppConfig):
    name = "collab.loadtest"
    label = "loadtest"
