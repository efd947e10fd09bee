"""Replay recorded or imported LLM traffic through the router and report serving latency."""
