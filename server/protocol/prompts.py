"""The MCP prompts: their names, arguments and descriptions. Each returns a text or makes one handler call."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

from server.inputs import PromptLanguage
from server.protocol import prompt_texts
from server.protocol.handlers import KnowledgeHandlers


def register_prompts(mcp: MCPServer[Any], handlers: KnowledgeHandlers) -> None:
    @mcp.prompt()
    def executor_retrieval_rules(language: PromptLanguage = "en") -> str:
        """The four retrieval rules for an executor agent that calls lookup_knowledge."""
        return prompt_texts.executor_rules(language)

    @mcp.prompt()
    async def planner_with_knowledge_map(language: PromptLanguage = "en") -> str:
        """A planner system prompt with the knowledge map injected."""
        return await handlers.planner_prompt(language)
