"""Per-agent policy: permission tiers, the spawn filter and command allow/deny lists."""
