"""The Django admin, extended for the staff who run collab (docs/architecture.md#a-admin):

- providers.py: providers (with a benchmark action) and assistants; changes are audited;
- rooms.py: rooms (status, members online, replies streaming, cost; lock, archive, close,
  stop all, export), memberships and roles, bans, messages;
- tools.py: agents' HTTP tools (audited like providers);
- mcp.py: MCP servers (audited like tools, with an action listing their tools), their
  tools (attached to assistants), and the audit of each call, read-only;
- defaults.py: the room defaults (the monthly budget of rooms without one), audited;
- audit.py: the audit log, read-only;
- votes.py: votes on replies, read-only, filterable by room;
- files.py: members' files, read-only, deletable (audited), and inline on their message;
- live.py: the live page (sockets, who is online, replies streaming now, on every process);
- usage.py: tokens and cost per day, as a chart, a table and CSV.
"""

from collab.chat.admin import audit, defaults, files, mcp, providers, rooms, tools, votes

__all__ = ["audit", "defaults", "files", "mcp", "providers", "rooms", "tools", "votes"]
