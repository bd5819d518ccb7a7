"""The only code that writes rooms, members and messages, by topic:

    rooms.py      rooms, members, invites, seqs, the posting rate, presence
    posting.py    a message: validate, rate-limit, store, start its replies
    replies.py    start / stop / regenerate / interrupt a reply; its sink (live text, frames, outcome)
    snapshot.py   what a (re)connecting member is shown
    providers.py  providers from the environment, their configuration, cost, deployment cap
    presence.py   who is typing (capped per member and room, across processes)
    budgets.py    a room's monthly budget: the check before any reply, what is left

Each validates first (raising errors.ClientError) and announces a change through
broadcast.py only after its transaction has committed. Sync functions serve the views;
async ones serve the consumer and run their database work through
`database_sync_to_async`.
"""
