"""The specon manager: collects heartbeats, decides migrations and rebalancing, journals them."""
