"""The embedded default: worker processes and a private redis-server on this machine."""
