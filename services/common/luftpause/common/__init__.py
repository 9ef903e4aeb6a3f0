"""luftpause package."""
