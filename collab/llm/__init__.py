"""Provider clients over the openai SDK. No Django models, no channels: plain data in,
text pieces out, every failure as one `LLMError` with a kind."""

from collab.llm.client import Endpoint, Finish, Item, LLMError, Thought, ToolCall, Usage, stream_chat

__all__ = ["Endpoint", "Finish", "Item", "LLMError", "Thought", "ToolCall", "Usage", "stream_chat"]
