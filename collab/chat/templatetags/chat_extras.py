from django import template
from django.utils.safestring import SafeString, mark_safe

from collab.chat import provider_env

register = template.Library()


@register.filter
def ms(value: float | None) -> str:
    """Milliseconds for people: 85 ms, 1.2 s."""
    if value is None:
        return ""
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"


@register.filter
def css_string(value: object) -> SafeString:
    """`value` as the inside of a quoted CSS string, e.g. an attribute selector's value:
    every character but ASCII letters, digits, "-" and "_" as a CSS escape (`\\HEX `).
    The result holds nothing HTML or CSS could read as markup: safe inside <style>."""
    return mark_safe("".join(c if c.isascii() and (c.isalnum() or c in "-_") else f"\\{ord(c):x} " for c in str(value)))


@register.filter
def model_label(model: str) -> str:
    """A model's name as pages show it: `{{ message.model|model_label }}`; the embedded
    local model's says what it is (provider_env.model_label)."""
    return provider_env.model_label(str(model))


@register.filter
def embedded_model(model: str) -> bool:
    """Whether `model` is the embedded local model: `{% if message.model|embedded_model %}`."""
    return provider_env.is_embedded_model(str(model))
