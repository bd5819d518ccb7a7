"""What every process may ask of the shared state; memory.py and redis.py implement it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

LEASE_TTL_S = 6.0  # a reply whose owner has not renewed its lease for this long is interrupted
PRESENCE_TTL_S = 6.0  # a socket not renewed for this long is offline (its process died)
KEEP_ENDED_S = 60.0  # an ended reply stays readable as "ended" this long (snapshots racing its end)
SLOT_TTL_S = 6.0  # a deployment-wide provider slot of a dead process frees itself after this
STATUS_TTL_S = 6.0  # a process's published status (the admin's live page) is gone this long after its last beat

OnQueued = Callable[[int], Awaitable[None]]


class ReplyEnded(Exception):
    """A piece for a reply that another process has already ended (its owner stalled past
    its lease): it is not recorded or sent; the owner stops."""


class StateLost(Exception):
    """A piece for a reply whose shared record is gone (Redis restarted, or lost its data):
    appending would record a text that no longer starts at offset 0. The owner restores
    the record with the whole text (`restore`) and goes on."""


@dataclass(frozen=True)
class LiveView:
    """A live reply as any process sees it.

    `text` is every piece flushed so far, in order (pieces that follow start at
    len(text)); `ended` once its owner has stored the final article; `state` is the
    label shown while it waits ("queued (2 ahead)") or writes; `thinking` is a reasoning
    model's thinking so far, a text of its own with offsets of its own.
    """

    text: str
    state: str = ""
    ended: bool = False
    thinking: str = ""


@dataclass(frozen=True)
class ProcessStatus:
    """What one server process last published about itself (lifecycle.Runtime.status):
    `status` as it sent it (JSON text), `age_s` since then, on the shared state's clock."""

    process: str
    status: str
    age_s: float


class SharedState(ABC):
    # --- live replies: text so far, state, owner lease ---------------------------------

    @abstractmethod
    async def begin(self, reply_id: int, room_id: int, owner: str) -> None:
        """Before a reply is announced: its (empty) text, and its owner's lease."""

    @abstractmethod
    async def append(self, reply_id: int, text: str, at_bytes: int, thinking: bool = False) -> None:
        """A flushed piece, before it is broadcast: a member that reads the text after
        joining the room's group gets every piece either here or from the group.
        `at_bytes`: where it starts in the text's UTF-8; a text of another length is not
        the owner's (StateLost), one that already ends with the piece takes it once.
        `thinking`: a piece of the reply's thinking, appended to that text instead."""

    async def append_and_publish(
        self, reply_id: int, text: str, at_bytes: int, channel: str, payload: bytes, thinking: bool = False
    ) -> bool:
        """`append`, then PUBLISH `payload` on `channel`, in one step where the backend can
        (one Redis round trip); False when it cannot, and the caller publishes itself.
        Raises ReplyEnded if another process has ended the reply meanwhile."""
        return False

    @abstractmethod
    async def restore(self, reply_id: int, room_id: int, owner: str, text: str, state: str, thinking: str = "") -> None:
        """The owner puts back a live reply's record (and its lease) after the shared state
        lost it: its whole text (and thinking) so far, and its label."""

    @abstractmethod
    async def set_state(self, reply_id: int, state: str) -> None: ...

    @abstractmethod
    async def end(self, reply_id: int) -> None:
        """After the final article is stored: no lease; the text is kept briefly."""

    @abstractmethod
    async def read(self, reply_ids: Sequence[int]) -> dict[int, LiveView]:
        """The live replies among `reply_ids`; one that has not begun is absent."""

    @abstractmethod
    async def renew_leases(self, reply_ids: Iterable[int]) -> None:
        """The owner's heartbeat for the replies it still runs."""

    @abstractmethod
    async def expired_leases(self) -> list[int]:
        """Replies whose owner stopped renewing (its process died or hung), each handed
        to one caller only: their leases are taken out as they are returned."""

    @abstractmethod
    async def leased(self, reply_ids: Sequence[int]) -> set[int]:
        """Those of `reply_ids` that some process holds a lease on."""

    @abstractmethod
    async def uptime_s(self) -> float:
        """How long this shared state has kept what it holds (the Redis server's uptime):
        leases younger than a lease period may be missing only because it restarted."""

    # --- posting rate ----------------------------------------------------------------------

    @abstractmethod
    async def take(self, key: str, burst: float, refill_s: float) -> bool:
        """A token from bucket `key` (a burst, then one per refill_s), or False."""

    # --- presence ----------------------------------------------------------------------------

    @abstractmethod
    async def join(self, room_id: int, user_id: int, socket: str) -> bool:
        """A socket opened the room. True when the room's online list changed."""

    @abstractmethod
    async def leave(self, room_id: int, user_id: int, socket: str) -> bool:
        """A socket closed. True when the room's online list changed."""

    @abstractmethod
    async def renew_presence(self, sockets: Iterable[tuple[int, int, str]]) -> list[int]:
        """This process's heartbeat for its open sockets: (room, user, socket). Returns the
        rooms where a socket had to be added back (its online list changed)."""

    @abstractmethod
    async def online(self, room_id: int) -> set[int]:
        """Ids of the users with the room open on any process."""

    @abstractmethod
    async def sweep_presence(self) -> list[int]:
        """Drop sockets of dead processes; the rooms whose online list changed."""

    # --- a provider's deployment-wide concurrency cap ------------------------------------

    @abstractmethod
    async def acquire_slot(self, name: str, cap: int, token: str, on_queued: OnQueued | None) -> None:
        """Wait (first come, first served) until fewer than `cap` streams of provider
        `name` run in the deployment; `on_queued(ahead)` when it must wait."""

    @abstractmethod
    async def release_slot(self, name: str, token: str) -> None: ...

    @abstractmethod
    async def renew_slots(self, held: Iterable[tuple[str, str]]) -> None:
        """This process's heartbeat for the slots it holds: (name, token)."""

    # --- each process's status (the admin's live page) -----------------------------------------

    @abstractmethod
    async def publish_status(self, process: str, status: str) -> None:
        """Process `process`'s status (JSON text), replacing its last one; gone by itself
        STATUS_TTL_S later unless published again (a dead process drops out)."""

    @abstractmethod
    async def process_statuses(self) -> list[ProcessStatus]:
        """The status of every process that published one within STATUS_TTL_S."""

    async def close(self) -> None:
        """Close connections (tests; a process shutting down)."""
        return None
