"""Anthropic's Messages API (Claude Code's door): the request's checks and its translation to
Chat Completions (`request`), the reply translated back (`reply`), and a reply relayed unchanged
read for the turn's facts (`observe`)."""
