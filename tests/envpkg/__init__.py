"""A user's own environment package, as tests/ holds it: `envpkg.corridor:Corridor-v0` registers on import."""
