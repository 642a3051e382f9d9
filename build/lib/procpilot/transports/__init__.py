"""Bytes and wire formats only: MCP, CLI."""
