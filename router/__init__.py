"""The Turnout router: an OpenAI-compatible reverse proxy that routes each request by policy."""
