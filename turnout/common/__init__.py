"""Pieces shared by the router and the replayer: the SSE stream meter, the capture schema."""
