"""The storm scenario (issue 38): the page's reconnect back-off as the load generator follows
it, and a tiny storm run for real (a server restarted under its sockets)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from collab.loadtest import backoff

ROOT = Path(__file__).resolve().parent.parent


# --- the back-off ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [1006, 1011, 1012, 1013, 4408, 4503, None])
def test_a_drop_waits_full_jitter_within_the_doubling_window(code: int | None) -> None:
    rng = random.Random(7)
    for retries in range(8):
        window = min(8000.0, 500.0 * 2**retries)
        delays = [backoff.delay_ms(code, "", retries, rng.random) for _ in range(400)]
        assert all(d is not None and 100.0 <= d <= window for d in delays), (retries, window)
        # Full jitter: the delays spread over the window, not bunched at its top.
        assert min(d for d in delays if d is not None) < 0.2 * window + 100
        assert max(d for d in delays if d is not None) > 0.8 * window


def test_the_formula_at_its_edges() -> None:
    assert backoff.delay_ms(1006, "", 0, lambda: 0.0) == 100.0  # the floor
    assert backoff.delay_ms(1006, "", 0, lambda: 0.5) == 250.0
    assert backoff.delay_ms(1006, "", 3, lambda: 0.5) == 2000.0
    assert backoff.delay_ms(1006, "", 30, lambda: 0.999) == pytest.approx(7992.0)  # the cap


def test_4429_waits_the_servers_hint_plus_jitter_of_it() -> None:
    assert backoff.delay_ms(4429, "retry=1200", 5, lambda: 0.0) == 1200.0
    assert backoff.delay_ms(4429, "retry=1200", 0, lambda: 0.5) == 1800.0
    rng = random.Random(3)
    delays = [backoff.delay_ms(4429, "draining retry=300", 9, rng.random) for _ in range(200)]
    assert all(d is not None and 300.0 <= d <= 600.0 for d in delays)
    # Without a readable hint it is a drop like any other.
    assert backoff.delay_ms(4429, "", 0, lambda: 0.5) == 250.0


def test_4403_stops() -> None:
    assert backoff.delay_ms(4403, "", 0) is None
    assert backoff.delay_ms(4403, "retry=100", 3) is None


# --- a storm for real ---------------------------------------------------------------------------


@pytest.mark.loadtest
@pytest.mark.timeout(600)
def test_a_tiny_storm_brings_every_socket_back_with_its_snapshot(tmp_path: Path) -> None:
    """2 rooms of 3, one streaming a long reply; the server is restarted under them: every
    socket reconnects (new process, same port) and gets its snapshot, and every reply each
    socket was following goes on or ends with nothing lost or repeated."""
    out = tmp_path / "out.json"
    cmd = [
        sys.executable, str(ROOT / "manage.py"), "loadtest", "--scenario", "storm", "--rooms", "2",
        "--members", "3", "--storm-share", "0.5", "--json", str(out), "--keep", str(tmp_path / "run"),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    storm = json.loads(out.read_text())["storm"]
    assert storm["error"] is None
    assert storm["restarted"] == "server"
    assert storm["sockets"] == 6
    assert storm["sockets_back"] >= 6 and storm["sockets_open_at_end"] == 6
    assert storm["all_back"] is True and storm["all_back_s"] > 0
    assert storm["connects"] >= 6 and storm["peak_connects_per_s"] >= 1
    ff = storm["first_frame_from_restart_ms"]
    assert ff["count"] >= 6 and 0 < ff["p50"] <= ff["p99"] <= ff["max"]
    assert storm["integrity"]["held"] is True, storm["integrity"]
    integrity = storm["integrity"]
    # The one reply was followed by all three members of its room, across the restart.
    assert integrity["replies_completed"] + integrity["replies_failed"] == 1
    assert "storm (server restarted): " in proc.stdout
