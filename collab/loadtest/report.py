"""The load-test report (docs/wire.md, "Load test report"), its table and its chart."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from collab.loadtest.agents import agent_line, agent_report
from collab.loadtest.files import files_line, files_report
from collab.loadtest.stats import Collector, percentiles

__all__ = [
    "LATENCY_KEYS",
    "REPORT_KEYS",
    "build_step",
    "draw_chart",
    "knee_of",
    "passes",
    "summary",
    "table",
]

LATENCY_KEYS = (
    "member_ttft_ms",
    "model_ttft_ms",
    "added_ttft_ms",
    "delivery_lag_ms",
    "skew_ms",
    "member_tokens_per_s",
)
REPORT_KEYS = (
    "scenario",
    "params",
    *LATENCY_KEYS,
    "frames_per_s",
    "deliveries_per_s",
    "chars_lost",
    "chars_duplicated",
    "chars_out_of_order",
    "replies_completed",
    "replies_failed",
    "errors",
    "server_cpu_percent",
    "server_rss_mb",
    "server_cpu_us_per_delivery",
    "server_cpu_us_per_token",
    "server_cpu_us_per_token_level",
    "server_loop_lag_ms",
    "generator_cpu_percent",
    "servers",
    "receptions_per_frame",
    "redis_cpu_percent",
    "redis_ops_per_reply",
)
LAG_LIMIT_MS = 100.0  # the knee: the highest load whose p99 delivery lag stays under this


def build_step(
    scenario: str,
    params: Mapping[str, Any],
    col: Collector,
    resources: Mapping[str, Any],
    model_ttft_fallback_ms: float,
    complete: bool = True,
) -> dict[str, Any]:
    """One load level's report from what the users measured and the processes' resources."""
    model = col.hists["model_ttft_ms"]
    model_p50 = model.quantile(0.5)
    shift = model_p50 if model_p50 is not None else model_ttft_fallback_ms
    window = col.window_s
    c = col.counts

    def rate(n: int) -> float | None:
        return round(n / window, 1) if window > 0 else None

    gen_cpu = resources.get("generator_cpu_percent")
    if gen_cpu is None:
        gen_cpu = col.generator_cpu_percent()
    report: dict[str, Any] = {
        "scenario": scenario,
        "params": dict(params),
        "member_ttft_ms": percentiles(col.hists["member_ttft_ms"]),
        "model_ttft_ms": percentiles(model),
        "added_ttft_ms": percentiles(col.hists["member_ttft_ms"], shift),
        "delivery_lag_ms": percentiles(col.hists["lag_ms"]),
        "skew_ms": percentiles(col.hists["skew_ms"]),
        "member_tokens_per_s": percentiles(col.hists["member_tokens_per_s"]),
        "frames_per_s": rate(c.get("frames", 0)),
        "deliveries_per_s": rate(c.get("deliveries", 0)),
        "chars_lost": c.get("chars_lost", 0),
        "chars_duplicated": c.get("chars_duplicated", 0),
        "chars_out_of_order": c.get("chars_out_of_order", 0),
        "replies_completed": c.get("replies_completed", 0),
        "replies_failed": c.get("replies_failed", 0),
        "errors": c.get("errors", 0),
        "server_cpu_percent": resources.get("server_cpu_percent"),  # the sum over the server processes
        "server_rss_mb": resources.get("server_rss_mb"),
        "server_cpu_us_per_delivery": resources.get("server_cpu_us_per_delivery"),
        "server_cpu_us_per_token": resources.get("server_cpu_us_per_token"),
        "server_cpu_us_per_token_level": resources.get("server_cpu_us_per_token_level"),
        # How late the servers' event loops ran a 20 ms timer (bucket bounds: "<= N ms").
        "server_loop_lag_ms": resources.get("server_loop_lag_ms"),
        "generator_cpu_percent": gen_cpu,
        "servers": list(resources.get("servers", [])),  # each server process
        # Processes that received each room frame, on average (docs/wire.md): 1.0 with rooms hashed.
        "receptions_per_frame": resources.get("receptions_per_frame"),
        "redis_cpu_percent": resources.get("redis_cpu_percent"),
        "redis_ops_per_reply": resources.get("redis_ops_per_reply"),
    }
    files = files_report(col)
    if files is not None:  # the files scenario (collab/loadtest/files.py)
        report["files"] = files
    agents = agent_report(col)
    if agents is not None:  # agent runs (collab/loadtest/agents.py)
        report["agents"] = agents
    report["details"] = {
        "complete": complete,
        "model_ttft_subtracted_ms": round(shift, 1),
        "model_ttft_source": "probes (p50)" if model_p50 is not None else "configured",
        "concurrent_replies_mean": round(col.reply_seconds / window, 2) if window > 0 else None,
        "concurrent_replies_peak_sum": col.peak_in_flight,
        "delivery_lag_newest_ms": percentiles(col.hists["lag_newest_ms"]),
        "delivery_lag_while_posting_ms": percentiles(col.hists["lag_while_posting_ms"]),
        "delivery_lag_otherwise_ms": percentiles(col.hists["lag_otherwise_ms"]),
        "delivery_lag_from_post_ms": percentiles(col.hists["lag_post_raw_ms"], shift),
        "reply_ms": percentiles(col.hists["reply_ms"]),
        "connect_ms": percentiles(col.hists["connect_ms"]),
        "window_s": round(window, 2),
        "posts": c.get("posts", 0),
        "member_replies": c.get("member_replies", 0),
        "final_mismatch": c.get("final_mismatch", 0),
        "tokens_mismatch": c.get("tokens_mismatch", 0),
        "error_codes": dict(sorted(col.error_codes.items())),
        "sockets": c.get("sockets", 0),
        "sockets_open_at_end": c.get("sockets_open_at_end", 0),
        "reconnects": c.get("reconnects", 0),
        "logins": c.get("logins", 0),
        "frames_total": c.get("frames_total", 0),
        "deliveries_total": c.get("deliveries_total", 0),
        "generator_cpu_self_percent": col.generator_cpu_percent(),
        **{k: v for k, v in resources.items() if k not in report},
    }
    return report


def passes(step: Mapping[str, Any], limit_ms: float = LAG_LIMIT_MS) -> bool:
    """Under the lag limit at p99 with nothing lost, duplicated, out of order or failed."""
    p99 = step["delivery_lag_ms"]["p99"]
    return (
        p99 is not None
        and p99 < limit_ms
        and step["chars_lost"] == 0
        and step["chars_duplicated"] == 0
        and step["chars_out_of_order"] == 0
        and step["replies_failed"] == 0
        and step["replies_completed"] > 0
        and step["details"].get("final_mismatch", 0) == 0
    )


def knee_of(steps: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """The highest level that passed (docs/wire.md ``knee``), or None."""
    best = None
    for step in steps:
        if passes(step):
            p = step["params"]
            if best is None or p["concurrent_replies"] > best["concurrent_replies"]:
                best = {"concurrent_replies": p["concurrent_replies"], "members": p["members_total"]}
    return best


# --- the table ------------------------------------------------------------------------------


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def _p(d: Mapping[str, Any] | None, key: str) -> Any:
    return d.get(key) if d else None


_COLUMNS: list[tuple[str, str]] = [
    ("rooms", "rooms"),
    ("members", "members"),
    ("replies", "conc. replies"),
    ("ttft", "member TTFT p50/p99"),
    ("model", "model TTFT p50"),
    ("added", "added TTFT p50/p99"),
    ("lag", "lag p50/p99/max"),
    ("skew", "skew p99"),
    ("tps", "tok/s p50"),
    ("fps", "frames/s"),
    ("dps", "deliv./s"),
    ("integrity", "lost/dup/ooo"),
    ("done", "ok/failed/err"),
    ("cpu", "server CPU%"),
    ("us", "CPU µs/deliv./token"),
    ("loop", "loop lag p50/p99 ≤"),
    ("rss", "RSS MB"),
    ("gen", "gen CPU%"),
    ("redis", "Redis CPU%"),
    ("ops", "Redis ops/reply"),
]


def _row(step: Mapping[str, Any]) -> dict[str, str]:
    p = step["params"]
    d = step.get("details", {})
    ttft, added, lag = step["member_ttft_ms"], step["added_ttft_ms"], step["delivery_lag_ms"]
    loop = step.get("server_loop_lag_ms")
    return {
        "rooms": _f(p.get("rooms")),
        "members": _f(p.get("members_total")),
        "replies": f"{_f(p.get('concurrent_replies'), 1)} ({_f(d.get('concurrent_replies_mean'), 1)})",
        "ttft": f"{_f(_p(ttft, 'p50'), 1)}/{_f(_p(ttft, 'p99'), 1)}",
        "model": _f(_p(step["model_ttft_ms"], "p50"), 1),
        "added": f"{_f(_p(added, 'p50'), 1)}/{_f(_p(added, 'p99'), 1)}",
        "lag": f"{_f(_p(lag, 'p50'), 1)}/{_f(_p(lag, 'p99'), 1)}/{_f(_p(lag, 'max'), 0)}",
        "skew": _f(_p(step["skew_ms"], "p99"), 1),
        "tps": _f(_p(step["member_tokens_per_s"], "p50"), 0),
        "fps": _f(step["frames_per_s"], 0),
        "dps": _f(step["deliveries_per_s"], 0),
        "integrity": f"{step['chars_lost']}/{step['chars_duplicated']}/{step['chars_out_of_order']}",
        "done": f"{step['replies_completed']}/{step['replies_failed']}/{step['errors']}",
        "cpu": _f(step["server_cpu_percent"], 0),
        "us": f"{_f(step.get('server_cpu_us_per_delivery'), 0)}/{_f(step.get('server_cpu_us_per_token'), 0)}",
        "loop": f"{_f(_p(loop, 'p50'), 0)}/{_f(_p(loop, 'p99'), 0)}",
        "rss": _f(step["server_rss_mb"], 0),
        "gen": _f(step["generator_cpu_percent"], 0),
        "redis": _f(step.get("redis_cpu_percent"), 0),
        "ops": _f((step.get("redis_ops_per_reply") or {}).get("total"), 1),
    }


def table(steps: Sequence[Mapping[str, Any]], markdown: bool = False) -> str:
    """The steps as a text (or Markdown) table; times in ms."""
    rows = [_row(s) for s in steps]
    heads = [h for _k, h in _COLUMNS]
    keys = [k for k, _h in _COLUMNS]
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "|" + "|".join(" ---: " for _ in heads) + "|"]
        lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in _COLUMNS]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(r[k].rjust(w) for k, w in zip(keys, widths, strict=True)) for r in rows]
    lines += [line for s in steps if (line := agent_line(s.get("agents"), f" ({s['params'].get('rooms')} rooms)"))]
    lines += [line for s in steps if (line := files_line(s.get("files"), f" ({s['params'].get('rooms')} rooms)"))]
    return "\n".join(lines)


def summary(step: Mapping[str, Any]) -> str:
    """One level in a line or three: what it offered, what it got, and what it cost."""
    p, d = step["params"], step["details"]
    lag, added = step["delivery_lag_ms"], step["added_ttft_ms"]
    if p.get("posts_per_s_per_room", 0) == 0:
        line = (
            f"  {p['sockets']} idle sockets: {d['sockets']} connected,"
            f" {d['sockets_open_at_end']} open at the end;"
            f" server RSS {step['server_rss_mb']} MB ({d.get('kb_per_connection')} KB per connection,"
            f" slope {d.get('kb_per_connection_slope')} KB);"
            f" {d.get('connects_per_s')} connects/s at {d.get('cpu_ms_per_connect')} ms of server CPU each"
            f" (the generator's pace), {d.get('cpu_percent_at_rest')}% CPU at rest"
        )
    else:
        line = (
            f"  {p['rooms']} rooms, {p['concurrent_replies']} replies offered"
            f" ({d['concurrent_replies_mean']} mean):"
            f" lag p99 {lag['p99']} ms, added TTFT p50/p99 {added['p50']}/{added['p99']} ms,"
            f" lost {step['chars_lost']}, failed {step['replies_failed']}, errors {step['errors']},"
            f" server CPU {step['server_cpu_percent']}%, generator CPU {step['generator_cpu_percent']}%"
        )
    if step.get("agents"):
        line += "\n  " + agent_line(step["agents"])
    if step.get("files"):
        line += "\n  " + files_line(step["files"])
    servers = step.get("servers") or []
    if len(servers) > 1:
        each = [
            f"#{i} {_f(s.get('cpu_percent'), 0)}% CPU {_f(s.get('rss_mb'), 0)} MB"
            f" {_f(s.get('sockets'))} sockets {_f(s.get('posts'))} posts {_f(s.get('replies'))} replies"
            f" {_f(s.get('frames_received'))} frames received"
            for i, s in enumerate(servers)
        ]
        line += "\n  server processes: " + "; ".join(each)
        route = step.get("params", {}).get("route", "?")
        line += f"\n  rooms {route}: {_f(step.get('receptions_per_frame'), 2)} receptions per frame"
        line += f", {_f(step.get('server_cpu_us_per_delivery'), 1)} us of server CPU per delivery"
    ops = step.get("redis_ops_per_reply")
    if ops or step.get("redis_cpu_percent") is not None:
        line += f"\n  Redis: {_f(step.get('redis_cpu_percent'), 0)}% CPU"
        if ops:
            top = [f"{cmd} {n:g}" for cmd, n in ops.items() if cmd != "total"][:5]
            line += f", {ops['total']:g} commands per reply ({', '.join(top)})"
    return line


# --- the chart ------------------------------------------------------------------------------


def draw_chart(reports: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> None:
    """Latency percentiles against load: one line per percentile and scenario (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=False)
    styles = ["-", "--", ":", "-."]
    colours = {"p50": "tab:green", "p95": "tab:orange", "p99": "tab:red", "max": "tab:gray"}
    for i, report in enumerate(reports):
        steps = report.get("steps") or [report]
        steps = sorted(steps, key=lambda s: s["params"].get("concurrent_replies", 0))
        xs = [s["params"].get("concurrent_replies", 0) for s in steps]
        name = report.get("scenario", "?")
        p = report.get("params", {})
        rate, window = p.get("tps", 0), p.get("coalesce_ms", 0)
        label = f"{name} ({p.get('layer', '')}, {rate:g} tok/s, coalesce {window:g} ms)"
        for ax, key in zip(axes, ("delivery_lag_ms", "added_ttft_ms"), strict=True):
            for q in ("p50", "p99"):
                ys = [s[key][q] if s[key][q] is not None else float("nan") for s in steps]
                ax.plot(
                    xs,
                    ys,
                    styles[i % len(styles)],
                    marker="osD^"[i % 4],
                    color=colours[q],
                    label=f"{label} {q}",
                )
    for ax, key in zip(axes, ("delivery lag (ms)", "time the app adds to first token (ms)"), strict=True):
        ax.set_xlabel("concurrent replies (one per room of 10 members, on average)")
        ax.set_ylabel(key)
        ax.set_yscale("symlog", linthresh=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].axhline(LAG_LIMIT_MS, color="black", linewidth=0.8, alpha=0.6)
    fig.suptitle(title or "collab load test: latency against load")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
