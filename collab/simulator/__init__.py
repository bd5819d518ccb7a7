"""OpenAI-compatible simulated model server (stands outside the app; HTTP only).

Public API:

- :func:`collab.simulator.text.simulated_tokens` / :func:`~collab.simulator.text.expected_text`
  — the deterministic reply, without a server.
- :class:`collab.simulator.config.SimConfig`, :func:`collab.simulator.config.parse_model`
  — settings and the ``sim+fault`` model-name syntax.
- :func:`collab.simulator.timing.token_offset` — when token ``i`` is written, after ``x-sim-start``.
- :func:`collab.simulator.app.make_app` — the ASGI app.
- :func:`collab.simulator.testing.running_simulator` — a real server on a free port for tests.
- ``manage.py simulate_model`` / ``python -m collab.simulator`` — the CLI.

This package imports nothing from the rest of ``collab``.
"""
