"""Backends: where requests are served. The simulator (virtual time) and live OpenAI-compatible servers."""
