"""convplane replay package."""
