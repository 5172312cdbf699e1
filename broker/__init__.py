"""The Warren broker: server, connections, channels and the messaging model."""
