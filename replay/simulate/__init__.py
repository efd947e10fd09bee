"""``replay simulate``: the router's own policies over the emulator's engine models, in
virtual time (no sockets, no sleeping), producing the same report as a live replay."""
