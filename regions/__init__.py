"""convplane regions package."""
