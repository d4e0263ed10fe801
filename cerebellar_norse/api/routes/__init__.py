"""Route modules, one per area."""
