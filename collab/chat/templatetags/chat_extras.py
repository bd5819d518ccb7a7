from django import template

register = template.Library()


@register.filter
def ms(value: float | None) -> str:
    """Milliseconds for people: 85 ms, 1.2 s."""
    if value is None:
        return ""
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"
