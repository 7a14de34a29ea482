"""convplane services package."""
