"""The load test's agent runs (issue 13): the log checker and timer on synthetic frames, and
a short ``loadtest --scenario agents`` end to end through the real command (simulator
scripted to call tools, Daphne and Locust as processes).

The end-to-end run asserts what the run must deliver (the report's ``agents`` figures
present and consistent, every run's final article and whole log at every member),
never how fast the machine is.
"""

from __future__ import annotations

import html
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from collab.loadtest.agents import AgentWatch, agent_report, calls_of, same_log, thinking_of
from collab.loadtest.report import REPORT_KEYS, table
from collab.loadtest.stats import Collector
from collab.loadtest.wire import parse_frame, thinking_pieces

ROOT = Path(__file__).resolve().parent.parent

LOG = [
    "▸ Plan\n",
    "1. Compute it. 2. Answer.\n",
    "\n▸ Step 2\n",
    '→ calculate({"expression": "6*7"})\n← calculate: 42\n',
    "\n▸ Check: ",
    "ON PLAN: the result serves.\n",
    "\n▸ Step 4\n",
    "It is forty two.\n",
    "\n✓ Final answer\n",
]
FULL = "".join(LOG)


def thinking_frame(i: int) -> bytes:
    offset = sum(len(p) for p in LOG[:i])
    return (
        f'<div id="msg-9-thinking" hx-swap-oob="beforeend" data-offset="{offset}">{html.escape(LOG[i])}</div>'
    ).encode()


def final_frame(log: str, steps: int = 4) -> bytes:
    return (
        '<article id="msg-9" data-seq="2" data-role="assistant" data-author="BOT" data-status="done" '
        f'data-tokens="4" data-steps="{steps}" hx-swap-oob="true"><header></header>'
        '<details class="thinking"><summary>Agent run</summary>'
        f'<div id="msg-9-thinking" class="thinking-body">{html.escape(log)}</div></details>'
        '<div id="msg-9-body" class="body md"><p>It is forty two.</p></div></article>'
    ).encode()


class _Reply:
    def __init__(self, final_at: float | None) -> None:
        self.final_at = final_at


class _Conn:
    def __init__(self, index: int, final_at: float | None) -> None:
        self.index = index
        self.replies = {9: _Reply(final_at)}


def test_thinking_pieces_and_the_final_log_parse() -> None:
    (piece,) = thinking_pieces(thinking_frame(3))
    assert (piece.msg, piece.offset, piece.text) == (9, len("".join(LOG[:3])), LOG[3])
    assert thinking_pieces(b'<div id="msg-9-body" hx-swap-oob="beforeend" data-offset="0">x</div>') == []
    shown = thinking_of(final_frame(FULL).decode())
    assert shown is not None and shown.text == FULL and not shown.rendered
    # An agent's ended log, rendered (docs/wire.md): the same words count as the same log.
    rendered = thinking_of(
        '<div id="msg-9-thinking" class="thinking-body md"><p>▸ Plan<br>\n<strong>1.</strong> alpha</p></div>'
    )
    assert rendered is not None and rendered.rendered and same_log("▸ Plan\n**1.** alpha", rendered)
    assert not same_log("▸ Plan\n**1.** beta", rendered)
    assert thinking_of("<article><div id='msg-9-body'></div></article>") is None
    # The model's words of each call (plan, check, final step), not the headings or tool lines.
    words = [FULL[start : ends[-1]] for start, ends in calls_of(FULL)]
    assert [w.strip() for w in words] == [
        "1. Compute it. 2. Answer.",
        "ON PLAN: the result serves.",
        "It is forty two.",
    ]


def watch(streams: list[list[int]], log: str = FULL, finals: tuple[float | None, ...] = ()) -> Collector:
    """Run 9 posted at 0.0, member i reading LOG pieces streams[i] 10 ms apart, then the final."""
    col = Collector()
    w = AgentWatch(col, "{{tool calculate {}}}", tps=750.0)
    final = final_frame(log)
    parsed_final = parse_frame(final)
    for member, stream in enumerate(streams):
        now = 0.1
        for i in stream:
            data = thinking_frame(i)
            w.on_frame(member, data, parse_frame(data), now)
            now += 0.01
        w.on_frame(member, final, parsed_final, now)
    at = finals or tuple(0.1 + 0.01 * len(s) for s in streams)
    assert w.finish(9, 0.0, parsed_final, [_Conn(i, t) for i, t in enumerate(at)])
    return col


def test_a_whole_log_at_every_member_is_measured() -> None:
    everything = list(range(len(LOG)))
    report = agent_report(watch([everything, everything]))
    assert report is not None
    assert report["runs"] == 1 and report["steps"]["p50"] == 4
    assert (report["finals_missing"], report["log_mismatch"], report["log_chars_lost"]) == (0, 0, 0)
    assert report["first_step_ms"]["p50"] == pytest.approx(100.0, abs=0.2)
    assert report["first_words_ms"]["p50"] == pytest.approx(110.0, abs=0.2)  # the plan's words: piece 1
    run_s = (0.1 + 0.01 * len(LOG)) * 1000
    assert report["run_ms"]["p50"] == pytest.approx(run_s, abs=1)
    assert report["steps_per_s"]["p50"] == pytest.approx(4 / (run_s / 1000), abs=0.01)


def test_a_gap_a_repeat_a_missing_final_or_another_log_are_counted() -> None:
    everything = list(range(len(LOG)))
    gap = agent_report(watch([everything, [i for i in everything if i != 3]]))
    assert gap is not None and gap["log_chars_lost"] == len(LOG[3]) and gap["log_mismatch"] == 1
    repeat = agent_report(watch([everything, [0, 1, 1, *everything[2:]]]))
    assert repeat is not None and repeat["log_chars_duplicated"] == len(LOG[1]) and repeat["log_mismatch"] == 0
    missing = agent_report(watch([everything, everything], finals=(0.2, None)))
    assert missing is not None and missing["finals_missing"] == 1 and missing["run_ms"]["count"] == 1
    other = agent_report(watch([everything], log=FULL.replace("42", "43")))
    assert other is not None and other["log_mismatch"] == 1
    assert agent_report(Collector()) is None
    # Not an agent run (no log, no data-steps): left to the room.
    w = AgentWatch(Collector(), "", tps=750.0)
    plain = parse_frame(b'<article id="msg-9" data-role="assistant" data-status="done" hx-swap-oob="true"></article>')
    assert not w.finish(9, 0.0, plain, [_Conn(0, 1.0)])


@pytest.mark.loadtest
@pytest.mark.timeout(600)
def test_agents_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [
        sys.executable, str(ROOT / "manage.py"), "loadtest", "--scenario", "agents", "--members", "3",
        "--runs", "2", "--duration", "4", "--reply-tokens", "100", "--json", str(out),
        "--keep", str(tmp_path / "run"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    for key in (*REPORT_KEYS, "agents"):
        assert key in report, key
    assert report["scenario"] == "agents" and report["params"]["runs"] == 2

    agents = report["agents"]
    assert agents["runs"] == 2
    # The script: plan, 2 x (a step calling a tool, its check), the final step.
    assert agents["steps"]["p50"] == agents["steps"]["max"] == 6
    # Nothing lost: every run's final article and whole log at every member.
    assert agents["first_step_ms"]["count"] == agents["run_ms"]["count"] == 3 * 2
    for key in ("finals_missing", "logs_missing", "log_mismatch", "log_chars_lost", "log_chars_duplicated"):
        assert agents[key] == 0, (key, agents)
    assert 0 < agents["first_step_ms"]["max"] < agents["run_ms"]["p50"]
    assert agents["first_words_ms"]["count"] == 3 * 2
    assert agents["first_step_ms"]["p50"] <= agents["first_words_ms"]["p50"] < agents["run_ms"]["p50"]
    assert 0 < agents["steps_per_s"]["p50"] <= agents["steps_per_s"]["max"]
    # steps/s is steps over the run's time, at the same member: their product is the steps.
    assert agents["steps_per_s"]["max"] * agents["run_ms"]["p50"] / 1000 >= 6 * 0.99

    # The answer's pieces as any reply's; the log's model words timed and spread.
    assert report["replies_completed"] == 2 and report["replies_failed"] == 0
    assert report["errors"] == 0, report["details"]["error_codes"]
    assert (report["chars_lost"], report["chars_duplicated"], report["chars_out_of_order"]) == (0, 0, 0)
    assert report["details"]["final_mismatch"] == 0
    assert report["delivery_lag_ms"]["count"] > 0 and report["skew_ms"]["count"] > 0
    assert isinstance(report["server_cpu_percent"], int | float)
    assert "agents: 2 runs" in proc.stdout and "agents (1 rooms): 2 runs" in table([report])


@pytest.mark.loadtest
@pytest.mark.timeout(600)
@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_agents_run_through_an_mcp_server_end_to_end(tmp_path: Path, transport: str) -> None:
    """`--mcp`: the run starts the load test's MCP server (or registers it as a stdio child),
    the agents' two rounds call its tools, and every call ends well, audited."""
    out, run = tmp_path / "out.json", tmp_path / "run"
    cmd = [
        sys.executable, str(ROOT / "manage.py"), "loadtest", "--scenario", "agents", "--mcp", transport,
        "--members", "3", "--runs", "2", "--duration", "4", "--reply-tokens", "100", "--json", str(out),
        "--keep", str(run),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["params"]["mcp"] == transport and "loadmcp__add" in report["params"]["agent_script"]
    agents = report["agents"]
    assert agents["runs"] == 2 and agents["steps"]["p50"] == agents["steps"]["max"] == 6
    assert agents["finals_missing"] == agents["log_mismatch"] == 0 and report["replies_failed"] == 0
    with sqlite3.connect(run / "db.sqlite3") as db:
        calls = db.execute("SELECT tool_name, outcome FROM chat_mcpcall ORDER BY id").fetchall()
    assert sorted(calls) == [("add", "ok"), ("add", "ok"), ("echo", "ok"), ("echo", "ok")]


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--scenario", "one-room", "--mcp", "http"], "--mcp is for the agents scenario"),
        (
            ["--scenario", "agents", "--mcp", "http", "--target", "http://x", "--credentials", "c.json"],
            "not with --target",
        ),
    ],
)
def test_mcp_is_refused_where_it_cannot_apply(args: list[str], refusal: str) -> None:
    with pytest.raises(CommandError, match=refusal):
        call_command("loadtest", *args)
