"""The usage page in the admin: tokens and cost per day, by room, user, assistant or
provider, over a date range, as a chart (a PNG drawn here with matplotlib), a table and
CSV. The figures come from collab.chat.usage (one aggregated query per request).

    /admin/chat/room/usage/      the page (form, chart, tables)
    /admin/chat/room/usage.csv   the per-day rows, as CSV
    /admin/chat/room/usage.png   the chart

All three take the same query (from, to: YYYY-MM-DD, both included, the last 30 days
by default, at most usage.MAX_DAYS; group: room, user, assistant, provider or total),
answer only staff (admin_view) who may view rooms and messages, and refuse a bad query
with its errors (400).
"""

from __future__ import annotations

import csv
import io
from datetime import date, timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.admin import AdminSite
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.views.decorators.http import require_GET

from collab.chat import usage

DEFAULT_DAYS = 30
TOP = 8  # groups drawn each in its own colour; the rest are one "(other)"
ROWS_SHOWN = 1000  # rows of the per-day table on the page (the CSV has them all)
PERMISSIONS = ["chat.view_room", "chat.view_message"]
DATE_ERROR = "Enter a date as YYYY-MM-DD, e.g. 2025-03-01."


class UsageForm(forms.Form):
    """The query: `from`, `to` and `group` (blank: the last DEFAULT_DAYS days, by room)."""

    def __init__(self, data: Any) -> None:
        super().__init__(data)
        date_input = forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d")
        self.fields["from"] = forms.DateField(
            required=False, widget=date_input, input_formats=["%Y-%m-%d"], error_messages={"invalid": DATE_ERROR}
        )
        self.fields["to"] = forms.DateField(
            required=False, widget=date_input, input_formats=["%Y-%m-%d"], error_messages={"invalid": DATE_ERROR}
        )
        self.fields["group"] = forms.ChoiceField(
            label="Group by", required=False, choices=list(usage.GROUPS.items()), initial="room"
        )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if self.errors:
            return cleaned
        end: date = cleaned.get("to") or timezone.localdate()
        start: date = cleaned.get("from") or end - timedelta(days=DEFAULT_DAYS - 1)
        if end < start:
            raise forms.ValidationError(f"The end date ({end}) is before the start date ({start}).", code="order")
        days = (end - start).days + 1
        if days > usage.MAX_DAYS:
            raise forms.ValidationError(
                f"At most {usage.MAX_DAYS} days at once; {start} to {end} is {days} days.", code="range"
            )
        cleaned.update({"from": start, "to": end, "group": cleaned.get("group") or "room"})
        return cleaned

    def report(self) -> usage.Report:
        return usage.report(self.cleaned_data["from"], self.cleaned_data["to"], self.cleaned_data["group"])

    def error_text(self) -> str:
        return "\n".join(f"{field}: {message}" for field, errors in self.errors.items() for message in errors)


def _form(request: HttpRequest) -> UsageForm:
    if not request.user.has_perms(PERMISSIONS):
        raise PermissionDenied
    return UsageForm(request.GET)


def _bad(form: UsageForm) -> HttpResponse:
    return HttpResponse(form.error_text() + "\n", status=400, content_type="text/plain; charset=utf-8")


def _filename(report: usage.Report, ext: str) -> str:
    return f"collab-usage-{report.group_by}-{report.start}-{report.end}.{ext}"


def page(request: HttpRequest, site: AdminSite) -> HttpResponse:
    form = _form(request)
    request.current_app = site.name
    context: dict[str, Any] = {
        **site.each_context(request),
        "title": "Usage: tokens and cost",
        "form": form,
        "groups": usage.GROUPS,
        "time_zone": timezone.get_current_timezone_name(),
    }
    if not form.is_valid():
        return TemplateResponse(request, "admin/chat/usage.html", context, status=400)
    report = form.report()
    # The range and group in effect, defaults filled in: the form shows them, the chart and CSV links repeat them.
    shown = {"from": report.start.isoformat(), "to": report.end.isoformat(), "group": report.group_by}
    context.update(
        {
            "form": UsageForm(shown),
            "report": report,
            "group_label": usage.GROUPS[report.group_by],
            "totals": report.totals(),
            "total": report.total(),
            "rows": report.rows[:ROWS_SHOWN],
            "rows_hidden": max(0, len(report.rows) - ROWS_SHOWN),
            "query": "?" + urlencode(shown),
            "top": TOP,
        }
    )
    return TemplateResponse(request, "admin/chat/usage.html", context)


def _cell(text: str) -> str:
    """A name as a CSV cell a spreadsheet will not run as a formula."""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def report_csv(report: usage.Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["day", report.group_by, "prompt_tokens", "completion_tokens", "cost_usd", "replies"])
    for row in report.rows:
        f = row.figures
        writer.writerow(
            [row.day.isoformat(), _cell(row.group), f.prompt_tokens, f.completion_tokens, f.cost_usd, f.replies]
        )
    return out.getvalue()


def csv_view(request: HttpRequest) -> HttpResponse:
    form = _form(request)
    if not form.is_valid():
        return _bad(form)
    report = form.report()
    response = HttpResponse(report_csv(report), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{_filename(report, "csv")}"'
    return response


def chart_png(report: usage.Report, top: int = TOP) -> bytes:
    """Tokens (above) and cost (below) per day, a stacked bar per group: the `top` biggest
    groups, the rest as one. CPU work, thread-safe: matplotlib's object API on the Agg
    canvas (no pyplot and its global state), imported here, not when the app loads."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import AutoDateLocator, DateFormatter, DayLocator, date2num
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    groups, figures = report.top(top)
    days = report.days
    fig = Figure(figsize=(10, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    tokens_ax, cost_ax = fig.subplots(2, 1, sharex=True)
    palette = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9"]  # tab10 less its grey (C7): "(other)" is grey
    tokens_base = [0.0] * len(days)
    cost_base = [0.0] * len(days)
    short = len(days) <= 62  # a tick a day or every few days; longer: months
    width = 0.8 if short else 1.0
    for i, group in enumerate(groups):
        colour = "0.6" if group == usage.OTHER else palette[i % len(palette)]
        cells = [figures.get((day, group), usage.Figures()) for day in days]
        tokens = [float(c.tokens) for c in cells]
        costs = [float(c.cost) for c in cells]
        tokens_ax.bar(days, tokens, width=width, bottom=tokens_base, color=colour, label=group)
        cost_ax.bar(days, costs, width=width, bottom=cost_base, color=colour)
        tokens_base = [b + t for b, t in zip(tokens_base, tokens, strict=True)]
        cost_base = [b + c for b, c in zip(cost_base, costs, strict=True)]
    what = usage.GROUPS[report.group_by].split(" (")[0]
    zone = timezone.get_current_timezone_name()
    tokens_ax.set_title(f"Tokens and cost per day by {what}, {report.start} to {report.end} ({zone})")
    tokens_ax.set_ylabel("tokens (prompt + completion)")
    cost_ax.set_ylabel("cost (USD)")
    tokens_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    cost_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"${v:,.4g}"))
    cost_ax.set_xlim(date2num(days[0]) - 0.6, date2num(days[-1]) + 0.6)
    if short:
        cost_ax.xaxis.set_major_locator(DayLocator(interval=-(-len(days) // 10)))
        cost_ax.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
    else:
        cost_ax.xaxis.set_major_locator(AutoDateLocator(minticks=4, maxticks=12))
    if groups:
        handles, labels = tokens_ax.get_legend_handles_labels()  # listed top down, as stacked
        tokens_ax.legend(
            handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False
        )
    else:
        tokens_ax.text(0.5, 0.5, "No replies in this range.", ha="center", va="center", transform=tokens_ax.transAxes)
    for ax in (tokens_ax, cost_ax):
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    fig.autofmt_xdate()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def png_view(request: HttpRequest) -> HttpResponse:
    form = _form(request)
    if not form.is_valid():
        return _bad(form)
    report = form.report()
    response = HttpResponse(chart_png(report), content_type="image/png")
    response["Content-Disposition"] = f'inline; filename="{_filename(report, "png")}"'
    return response


def urls(site: AdminSite) -> list[URLPattern]:
    """Prepended to the room admin's URLs (RoomAdmin.get_urls): /admin/chat/room/usage/..."""

    def usage_page(request: HttpRequest) -> HttpResponse:
        return page(request, site)

    return [
        path("usage/", site.admin_view(require_GET(usage_page)), name="chat_room_usage"),
        path("usage.csv", site.admin_view(require_GET(csv_view)), name="chat_room_usage_csv"),
        path("usage.png", site.admin_view(require_GET(png_view)), name="chat_room_usage_png"),
    ]
