from django.apps import AppConfig


class RealtimeConfig(AppConfig):
    name = "apps.realtime"
    label = "realtime"
    verbose_name = "Real-time RL: serving, sessions and feedback, the collect → train → eval → gate → deploy cycle"
